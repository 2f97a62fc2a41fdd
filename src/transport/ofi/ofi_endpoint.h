// The libfabric endpoint under the ofi transport: its fabric, domain, CQ and AV, and every
// operation and request posted on it, with the process's shared endpoints (one per provider
// and interface) that communicators join as numbered channels (ofi_transport.h). Internal to
// transport/ofi.
#pragma once

#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <sys/types.h>
#include <unistd.h>

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "transport/ofi/fi_resources.h"
#include "transport/ofi/ofi_detail.h"
#include "transport/ofi/ofi_transport.h"

namespace hicoll::ofi {

// Channels a shared endpoint carries at most: the tag bits above tags::kTagBits number them.
constexpr size_t kMaxChannels = 1024;

struct MrEntry;
class OfiTransport;  // a channel (ofi_transport.cc)

// One posted libfabric operation (a message or one chunk of a split message).
struct Op {
  fi_context2 ctx;  // first: the CQ hands back &ctx
  uint32_t req = 0;
  uint32_t gen = 0;
  size_t offset = 0;
  size_t len = 0;
  MrEntry* mr = nullptr;               // on-the-fly registration held while posted
  const OfiTransport* chan = nullptr;  // the channel that posted it (null: its channel closed)
  bool in_use = false;
};
static_assert(offsetof(Op, ctx) == 0);

// On-the-fly registration (only where the provider needs a descriptor for every buffer). Kept
// only while some operation uses it: a cached registration that outlives its buffer would
// point at old pages once the range is unmapped and mapped again; providers that need local
// MRs (efa, verbs) keep their own cache with a memory monitor for that.
struct MrEntry {
  uintptr_t start = 0, end = 0;
  FidPtr<fid_mr> mr;
  int refs = 0;
};

struct Request {
  uint32_t gen = 1;
  bool live = false;
  bool send = false;
  const OfiTransport* chan = nullptr;  // names the peer in its errors
  int peer = -1;
  uint64_t tag = 0;  // the channel's (without its number)
  size_t len = 0;
  size_t* received = nullptr;  // irecvUpTo: a shorter message completes it, its length here
  uint32_t pending = 0;        // posted operations not yet completed
  hcResult_t err = hcSuccess;
  std::string msg;
};

struct Region {
  size_t len;
  FidPtr<fid_mr> mr;
};

// A libfabric endpoint with its fabric, domain, CQ and AV, and every operation and request
// posted on it: one communicator's own, or the process's shared one (one per provider and
// interface), on which each communicator is a channel whose tags carry its number above
// tags::kTagBits. Every field is under mu, every channel's requests included.
struct Endpoint {
  ~Endpoint();  // the endpoint closes first: then the provider touches no context or buffer

  InfoPtr info;
  FidPtr<fid_fabric> fabric;
  FidPtr<fid_domain> domain;
  FidPtr<fid_cq> cq;
  FidPtr<fid_av> av;
  FidPtr<fid_ep> ep;
  std::string provider, key;  // key: its place among the shared endpoints ("" for an own one)
  pid_t pid = getpid();       // a forked child opens its own (the sockets are its parent's)
  int tag_bits = 64;
  uint64_t tag_mask = ~0ull;
  size_t max_chunk = SIZE_MAX;
  bool local_mr = false, mr_endpoint = false, prov_key = false;
  uint64_t next_key = 1;

  std::mutex mu;        // one lock for everything: a watchdog thread may call abort()
  bool broken = false;  // a split message was half posted: the stream is out of step
  std::deque<Op> ops;   // stable addresses: contexts live until their completion or the close
  std::vector<Op*> free_ops;
  size_t ops_in_use = 0;
  std::vector<Request> reqs;
  std::vector<uint32_t> free_reqs;
  std::list<MrEntry> cache;
  std::vector<FidPtr<fid_mr>> orphan_mrs;  // regions of channels closed with operations in flight
  uint64_t mr_regs = 0, mr_reuses = 0, region_hits = 0, post_retries = 0;

  // Shared: channel numbers in use, or retired (a channel that failed, or closed with messages
  // in flight or requests unfinished: a late message must not reach a later channel). Numbers
  // are taken in turn from next_channel, so one comes round again only after the others.
  size_t channels = 0;  // numbers it can carry: 2^(tag bits - kTagBits), at most kMaxChannels
  std::bitset<kMaxChannels> used, retired;
  size_t next_channel = 0;
  bool detached = false;  // left the shared ones: a channel closed with operations it could not stop
};

// Opens an endpoint for rank (named in errors); av_count: the addresses it expects (a hint);
// key: the shared one's place ("": an own one).
std::shared_ptr<Endpoint> openEndpoint(int rank, const OfiOptions& opt, const ofi_detail::OfiTuning& tuning,
                                       size_t av_count, const std::string& key = "");
// The process's shared endpoint for opt's provider and interface, opened at the first call.
std::shared_ptr<Endpoint> sharedEndpoint(int rank, const OfiOptions& opt);
// e takes no new channels (the ones it has keep it until they close).
void leaveSharing(Endpoint& e);

// Tag bits a provider carries, from its mem_tag_format.
int tagBitsOf(uint64_t mem_tag_format);
// The IPv4 address of a network interface (port 0); false for names that are not one.
bool ifaceIpv4(const std::string& iface, sockaddr_in* out);

}  // namespace hicoll::ofi
