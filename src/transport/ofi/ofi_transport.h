// The libfabric transport: RDM endpoint, tagged messages, manual progress.
//
// Matching: a receive from peer P with tag T matches only messages sent by P with tag T
// (FI_DIRECTED_RECV, exact tag), in posting order (FI_ORDER_SAS). Tags must fit the
// provider's tag width, taken from mem_tag_format (tcp;ofi_rxm: 64 bits, net: 63 bits); a
// wider tag is hcInvalidArgument at post. Messages above the provider's max_msg_size are split
// into consecutive chunks with the same tag (both sides split identically: lengths must agree).
//
// Close only after the peers have received what this rank sent (a bootstrap barrier does):
// a send completes locally, and with net (libfabric 1.17) a message whose sender closed its
// endpoint before the receiver matched it is lost.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "bootstrap/bootstrap.h"
#include "transport/transport.h"

namespace hicoll {

struct OfiOptions {
  std::string provider;  // e.g. "tcp;ofi_rxm" (FI_PROVIDER env, when set, takes precedence); "" = tcp;ofi_rxm
  std::string iface;     // e.g. "lo"; "" = provider's choice (for tcp;ofi_rxm this is hints->domain_attr->name)
  long timeout_ms = 120000;
  // Called while a post waits for queue space (it may throw: a peer known to be gone).
  std::function<void()> while_blocked;
  // The number of the call this rank is in (CallClock, base/deadline.h); empty: every notice is due.
  CallClock call_now;
  // Names a rank in messages ("rank 3 (node 'n1')", hcComm::who); empty: by its fabric address.
  // Users know their nodes, not the provider's addresses.
  std::function<std::string(int)> who;
  // Join the process's shared endpoint for this provider and interface when every rank can
  // (HICOLL_OFI_SHARED_ENDPOINT), rather than open one of its own.
  bool share = false;
};

// Collective over bs (all ranks of the communicator call it): opens fabric/domain/endpoint/AV/CQ,
// exchanges endpoint names with bs.allgather, inserts all into the AV, then exchanges one small
// message with every peer (connections are up and addresses verified before it returns).
//
// Sharing (opt.share): an endpoint costs memory and connections (rxm's buffer pools: tens of
// MB), so the communicators of a process may share one per provider and interface, each a
// channel with its own number in the tag bits above tags::kTagBits (and tagBits() =
// tags::kTagBits). The ranks agree on a number free on all of them in the same exchange, and
// take it unless another communicator of one's process took it meanwhile (then all try again);
// where one cannot share (sharing off, no number free on all, a provider without the bits), all
// open their own. Requests, errors, notices and abort() are the channel's; a dead peer fails
// every channel's operations to it, as it fails them all.
//
// Two tags are the transport's own: all ones of its tag width (the warm-up) and all ones - 1
// (failure notices, one receive per peer posted for the channel's life; on an own endpoint
// only when the provider has bits above tags::kTagBits). Throws hicoll::Error.
std::unique_ptr<Transport> makeOfiTransport(Bootstrap& bs, const OfiOptions& opt);

// The IPv4 address (dotted) of network interface iface, "" when it has none (or iface is "").
std::string interfaceIpv4(const std::string& iface);

// The largest message a transport opened with opt sends eagerly: with rxm the eager limit it
// will run with (FI_OFI_RXM_EAGER_LIMIT from the environment, which hicoll sets when it loads
// unless the user did, else rxm's bounce buffers' size: FI_OFI_RXM_BUFFER_SIZE or 16 KiB); 0 for
// providers without one. Larger messages still arrive, by rxm's slower protocols.
size_t ofiEagerLimit(const OfiOptions& opt);

}  // namespace hicoll
