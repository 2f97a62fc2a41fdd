// The device path's call agreement: every collective's descriptor is compared with the node's
// ranks (through the node segment) and with the rail peers (one 32-byte message each way), so
// that ranks which called different collectives, counts, datatypes, ops or roots fail with both
// calls named instead of pairing their counters and returning wrong data or hanging. The check
// runs beside the data movement (the proxy polls it in the same loop) and costs the stream
// nothing.
#include "device/hier_engine.h"

#include "base/error.h"

namespace hicoll::dev {
namespace {

// Above the data tags (job number in bits 24-55, step in 0-23).
constexpr uint64_t kDescTag = uint64_t{1} << 56;

uint64_t descTag(uint64_t job) {
  return kDescTag | (job & 0xffffffffull) << 24;
}

}  // namespace

void HierEngine::publishDesc(const Job& job) {
  uint64_t* line = res_.flags.descLine(l_, job.id);
  __atomic_store_n(&line[4], 0, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  for (int i = 0; i < 4; ++i) __atomic_store_n(&line[i], job.desc.w[i], __ATOMIC_RELAXED);
  __atomic_store_n(&line[4], job.id, __ATOMIC_RELEASE);
}

void HierEngine::postDescs(const Job& job) {
  local_ok_.assign(static_cast<size_t>(L_), 0);
  local_ok_[static_cast<size_t>(l_)] = 1;
  desc_recv_.clear();
  desc_send_.clear();
  if (N_ == 1 || res_.net->tagBits() < 57) return;
  if (rails_.empty())
    for (int m = 0; m < N_; ++m)
      if (m != n_) rails_.push_back(res_.topo.rankAt(m, l_));
  desc_in_.resize(rails_.size());
  desc_out_ = job.desc;
  const uint64_t tag = descTag(job.id);
  for (size_t i = 0; i < rails_.size(); ++i) {
    desc_in_[i] = CallDesc{};
    desc_recv_.push_back(res_.net->irecv(rails_[i], &desc_in_[i], sizeof(CallDesc), tag));
    desc_send_.push_back(res_.net->isend(rails_[i], &desc_out_, sizeof(CallDesc), tag));
  }
}

HierEngine::DescRead HierEngine::readDesc(int local, uint64_t job, CallDesc* out) const {
  uint64_t* line = res_.flags.descLine(local, job);
  const uint64_t id = __atomic_load_n(&line[4], __ATOMIC_ACQUIRE);
  if (id < job) return DescRead::NotYet;
  if (id > job) return DescRead::Overwritten;  // it ran kDescRing collectives ahead
  for (int i = 0; i < 4; ++i) out->w[i] = __atomic_load_n(&line[i], __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  return __atomic_load_n(&line[4], __ATOMIC_RELAXED) == id ? DescRead::Read : DescRead::Overwritten;
}

void HierEngine::compareLocalDescs(const Job& job) const {
  CallDesc theirs;
  for (int p = 0; p < L_; ++p)
    if (p != l_ && readDesc(p, job.id, &theirs) == DescRead::Read) compareDesc(res_.topo.rankAt(n_, p), theirs, job);
}

bool HierEngine::pollDescs(const Job& job) {
  bool done = true;
  for (int p = 0; p < L_; ++p) {
    if (local_ok_[static_cast<size_t>(p)]) continue;
    CallDesc theirs;
    const DescRead r = readDesc(p, job.id, &theirs);
    if (r == DescRead::NotYet) {
      done = false;
      continue;
    }
    if (r == DescRead::Read) compareDesc(res_.topo.rankAt(n_, p), theirs, job);
    local_ok_[static_cast<size_t>(p)] = 1;  // compared, or skipped (overwritten)
  }
  for (size_t i = 0; i < desc_recv_.size(); ++i) {
    if (desc_recv_[i] == 0) continue;
    if (!res_.net->test(desc_recv_[i])) {
      done = false;
      continue;
    }
    desc_recv_[i] = 0;
    compareDesc(rails_[i], desc_in_[i], job);
  }
  for (ReqId& s : desc_send_) {
    if (s == 0) continue;
    if (res_.net->test(s)) s = 0;
    else done = false;
  }
  return done;
}

std::string HierEngine::missingDescs() const {
  std::string m;
  auto add = [&](const std::string& s) { m += (m.empty() ? "" : ", ") + s; };
  for (int p = 0; p < L_; ++p)
    if (!local_ok_.empty() && !local_ok_[static_cast<size_t>(p)]) add(fmt::format("rank {}", res_.topo.rankAt(n_, p)));
  for (size_t i = 0; i < desc_recv_.size(); ++i)
    if (desc_recv_[i]) add(fmt::format("rank {}", rails_[i]));
  return m;
}

void HierEngine::compareDesc(int peer, const CallDesc& theirs, const Job& job) const {
  if (theirs.sameCall(job.desc)) return;
  HC_THROW(hcInvalidUsage, "{}", callMismatch(res_.topo.who(peer), theirs, res_.rank, job.desc));
}

}  // namespace hicoll::dev
