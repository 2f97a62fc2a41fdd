// Internals of the ofi transport that tests (and diagnostics) reach: knobs that force rare
// provider behaviour on tcp/net (message splitting, local memory registration) and a view of
// what was chosen. Not part of the interface other code programs against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/ofi/ofi_transport.h"

namespace hicoll::ofi_detail {

struct OfiTuning {
  size_t max_msg_size = 0;      // 0: the provider's max_msg_size; else split messages above this
  bool force_local_mr = false;  // act as if the provider demanded FI_MR_LOCAL
};

std::unique_ptr<Transport> makeOfiTransport(Bootstrap& bs, const OfiOptions& opt, const OfiTuning& tuning);

struct OfiInfo {
  std::string provider, fabric, domain, address;
  int tag_bits = 0;
  int channel = -1;           // its number on the process's shared endpoint; -1: an own endpoint
  size_t max_chunk = 0;       // messages above this are split
  bool local_mr = false;      // every buffer needs a descriptor (registered on the fly if needed)
  uint64_t mr_regs = 0;       // fi_mr_reg calls made on the fly (not counting registerRegion)
  uint64_t mr_reuses = 0;     // on-the-fly registrations shared by concurrent operations
  uint64_t region_hits = 0;   // operations that used a registerRegion descriptor
  uint64_t post_retries = 0;  // posts the provider refused with -FI_EAGAIN (queue full), then retried
};
// Throws hcInvalidArgument when t is not an ofi transport.
OfiInfo ofiInfo(Transport& t);

}  // namespace hicoll::ofi_detail
