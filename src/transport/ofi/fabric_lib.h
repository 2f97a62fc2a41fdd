// libfabric's exported entry points, loaded with dlopen when a communicator first needs the
// network (libhicoll does not link libfabric). Loading it lazily keeps it out of processes that
// never go past one node, and lets hicoll set IPATH_NO_BACKTRACE first: Debian's libfabric
// pulls in libinfinipath, whose constructor installs handlers for SIGINT, SIGTERM, SIGSEGV...
// that write backtrace files into the working directory and turn a signal death into exit
// status 1 (and take Ctrl-C from Python). Everything else in libfabric's API is inline calls
// through the objects these return.
#pragma once

#include <rdma/fabric.h>

namespace hicoll::ofi {

struct FabricLib {
  decltype(&::fi_getinfo) getinfo;
  decltype(&::fi_freeinfo) freeinfo;
  decltype(&::fi_dupinfo) dupinfo;
  decltype(&::fi_fabric) fabric;
  decltype(&::fi_strerror) strerror;
  decltype(&::fi_version) version;
};

// Whether FI_OFI_RXM_EAGER_LIMIT is hicoll's (set when libhicoll loaded, from the
// environment's knobs: HICOLL_OFI_RXM_EAGER, the net chunk) rather than the user's.
bool rxmEagerLimitSetByHicoll();

// Loads it on first use; throws hcUnsupported naming the library when it cannot.
const FabricLib& fabricLib();

}  // namespace hicoll::ofi
