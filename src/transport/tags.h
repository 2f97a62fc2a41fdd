// The tag space of a communicator's messages over a transport: every tag hicoll's layers post
// is below 2^kTagBits, so that a transport keeps the bits above for itself: the number of a
// communicator that shares its endpoint with others (ofi/), and on an endpoint of its own its
// own messages (on a shared one those take the space's top two values, which no probe round
// reaches). A tag's class
// sits in its top two bits, so the kinds of message never match each other in flight:
//
//   collectives (algorithms/run.h): phase sequence (24 bits, wrapping), step, chunk
//   agreement (algorithms/agree.h): the call's number (wrapping)
//   point-to-point (algorithms/p2p.h): envelope / data / acknowledgement, sequence (wrapping)
//   link probe (core/net_probe.cc): round, chunk
//
// Wrapping counters are safe: the messages of one phase (call, sequence) are all taken long
// before the counter comes round (2^24 phases later at the least).
#pragma once

#include <cstdint>

namespace hicoll::tags {

constexpr int kTagBits = 54;
constexpr int kPayloadBits = kTagBits - 2;
constexpr uint64_t kPayloadMask = (uint64_t{1} << kPayloadBits) - 1;

enum class Class : uint64_t { Collective = 0, Agreement = 1, P2p = 2, Probe = 3 };

constexpr uint64_t make(Class c, uint64_t payload) {
  return static_cast<uint64_t>(c) << kPayloadBits | (payload & kPayloadMask);
}
constexpr Class classOf(uint64_t tag) {
  return static_cast<Class>(tag >> kPayloadBits & 3);
}

}  // namespace hicoll::tags
