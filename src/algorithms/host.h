// Host-buffer collectives: plan the path (hierarchical, ring, or the ring as fallback: see
// plan/plan.h) and run it, blocking, with statistics and the fallback announced.
#pragma once

#include <string>

#include "base/coll.h"

struct hcComm;

namespace hicoll {

struct Capabilities;
// What host buffers on comm let a path do (plan/plan.h).
Capabilities hostCapabilities(const hcComm& comm);

// Runs a (its call number set), agreed with the peers; every error is fatal to the
// communicator and names the call.
void runHostCollective(hcComm& comm, const CollArgs& a);
// a was rejected on this rank for `why` (its call number set): takes part in the call's
// agreement with an invalid descriptor, so peers fail this same call, and throws
// hcInvalidArgument: fatal unless every rank rejected the call (then nothing moved).
// A quantized call (a.quant.block set, quantized.cc): packs this rank's block, runs the exact
// collective on the packed images, unpacks.
void runQuantized(hcComm& comm, const CollArgs& a);
[[noreturn]] void rejectCall(hcComm& comm, const CollArgs& a, const std::string& why);

}  // namespace hicoll
