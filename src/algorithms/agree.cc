#include "algorithms/agree.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "algorithms/run.h"
#include "core/comm.h"
#include "base/error.h"

namespace hicoll {
namespace {
constexpr size_t kHeader = sizeof(CallDesc);
constexpr size_t kStandaloneBytes = kHeader + hcComm::AgreeMsg::kReason;
}  // namespace

bool Agreement::canPiggyback(size_t first_message_bytes) { return first_message_bytes <= hcComm::AgreeMsg::kBody; }

Agreement::Agreement(hcComm& c, const CallDesc& mine, const std::string& reason, bool piggyback)
    : c_(c), mine_(mine) {
  if (c.agree_peers.empty() || !c.ofi || c.ofi->tagBits() < 61) return;
  const size_t P = c.agree_peers.size();
  left_ = P;
  if (piggyback) {
    piggyback_ = true;
    sent_.assign(P, 0);
    received_.assign(P, 0);
    std::fill(c.agree_got.begin(), c.agree_got.end(), 0);
    return;
  }
  const uint64_t tag = agreementTag(mine.w[3]);
  recvs_.assign(P, 0);
  std::fill(c.agree_got.begin(), c.agree_got.end(), 0);
  for (size_t i = 0; i < P; ++i) {
    hcComm::AgreeMsg& out = c.agree_out[i];
    out.desc = mine;
    std::snprintf(out.body, hcComm::AgreeMsg::kReason, "%s", reason.c_str());
    c.agree_in[i].desc = CallDesc{};  // a size mismatch must not show the last call's
    // Up to a whole staging message: a peer whose call differs may have piggybacked.
    recvs_[i] = c.ofi->irecvUpTo(c.agree_peers[i], &c.agree_in[i], sizeof(hcComm::AgreeMsg), tag, &c.agree_got[i]);
    sends_.push_back(c.ofi->isend(c.agree_peers[i], &out, kStandaloneBytes, tag));
  }
  left_ += sends_.size();
}

std::vector<int> Agreement::missing() const {
  std::vector<int> peers;
  for (size_t i = 0; i < recvs_.size(); ++i)
    if (recvs_[i] != 0) peers.push_back(c_.agree_peers[i]);
  return peers;
}

int Agreement::indexOf(int peer) const {
  auto it = std::find(c_.agree_peers.begin(), c_.agree_peers.end(), peer);
  return it == c_.agree_peers.end() ? -1 : static_cast<int>(it - c_.agree_peers.begin());
}

int Agreement::stageSend(int peer, const void*& buf, size_t& len, uint64_t& tag) {
  const int i = piggyback_ ? indexOf(peer) : -1;
  if (i < 0 || sent_[i]) return -1;
  HC_CHECK(canPiggyback(len), hcInternalError, "agreement: a first message of {} bytes cannot carry the descriptor", len);
  sent_[i] = 1;
  hcComm::AgreeMsg& out = c_.agree_out[i];
  out.desc = mine_;
  if (len) std::memcpy(out.body, buf, len);
  buf = &out;
  len += kHeader;
  tag = agreementTag(mine_.w[3]);
  return i;
}

int Agreement::stageRecv(int peer, void*& buf, size_t& len, uint64_t& tag, size_t*& received) {
  const int i = piggyback_ ? indexOf(peer) : -1;
  if (i < 0 || received_[i]) return -1;
  HC_CHECK(canPiggyback(len), hcInternalError, "agreement: a first message of {} bytes cannot carry the descriptor", len);
  received_[i] = 1;
  c_.agree_in[i].desc = CallDesc{};
  buf = &c_.agree_in[i];
  len = sizeof(hcComm::AgreeMsg);
  c_.agree_got[i] = 0;
  received = &c_.agree_got[i];
  tag = agreementTag(mine_.w[3]);
  return i;
}

void Agreement::landed(int index, void* dst, size_t len) {
  --left_;
  const size_t got = c_.agree_got[index];
  if (got < kHeader) c_.agree_in[index].desc = CallDesc{};  // no descriptor: shows as a disagreement
  check(static_cast<size_t>(index));
  // The same call sends the same first message; anything else is a bug, not a user error.
  HC_CHECK(got == kHeader + len, hcInternalError, "{} sent a first message of {} bytes where {} were due ({})",
           c_.who(c_.agree_peers[index]), got, kHeader + len, describeCall(mine_));
  if (len) std::memcpy(dst, c_.agree_in[index].body, len);
}

void Agreement::failed(int index) {
  // The message arrived with another length: its first bytes are the peer's descriptor.
  const CallDesc& theirs = c_.agree_in[index].desc;
  if (theirs.w[3] != 0 && !theirs.sameCall(mine_)) check(static_cast<size_t>(index));
}

void Agreement::check(size_t i) {
  const hcComm::AgreeMsg& m = c_.agree_in[i];
  const int peer = c_.agree_peers[i];
  if (m.desc.invalid()) {
    if (mine_.invalid()) return;
    const std::string why(m.body, strnlen(m.body, hcComm::AgreeMsg::kReason));
    HC_THROW(hcRemoteError, "{} rejected its arguments of {}{}{}", c_.who(peer), describeCall(m.desc),
             why.empty() ? "" : ": ", why);
  }
  any_valid_ = true;
  if (mine_.invalid() || m.desc.sameCall(mine_)) return;
  if ((m.desc.flags() ^ mine_.flags()) & CallDesc::kDestroy)
    HC_THROW(hcRemoteError, "{} {}", c_.who(peer),
             m.desc.flags() & CallDesc::kDestroy
                 ? fmt::format("destroyed its communicator while rank {} called {}", c_.rank, describeCall(mine_))
                 : fmt::format("called {} while this rank destroys its communicator", describeCall(m.desc)));
  HC_THROW(hcInvalidUsage, "{}", callMismatch(c_.who(peer), m.desc, c_.rank, mine_));
}

bool Agreement::poll(bool collect) {
  if (left_ == 0 || piggyback_) return left_ == 0;
  for (size_t i = 0; i < recvs_.size(); ++i) {
    if (recvs_[i] == 0) continue;
    bool done = false;
    try {
      done = c_.ofi->test(recvs_[i]);
    } catch (const Error& e) {
      // Another length: a peer whose call differs sent its first message with the descriptor.
      recvs_[i] = 0;
      if (e.code() == hcInvalidUsage) failed(static_cast<int>(i));
      throw;
    }
    if (!done) continue;
    recvs_[i] = 0;
    --left_;
    if (collect) {
      try {
        check(i);
      } catch (const Error&) {
        any_valid_ = true;  // a valid peer that disagrees is still a valid peer
      }
    } else {
      check(i);
    }
  }
  left_ -= completeEach(sends_, [&](ReqId s) { return c_.ofi->test(s); });
  return left_ == 0;
}

void Agreement::finish(Run& r, bool collect) {
  if (piggyback_) {
    HC_CHECK(left_ == 0, hcInternalError, "agreement: {} agreement peer(s) exchanged no message in {}", left_,
             describeCall(mine_));
    return;
  }
  Backoff backoff;
  while (!poll(collect)) r.idle(false, backoff, "waiting for the agreement peers' call descriptors");
}

void Agreement::explain(long ms) {
  if (left_ == 0 || piggyback_) return;
  Deadline d(ms);
  Backoff backoff;
  try {
    while (!poll() && !d.expired()) backoff.pause();
  } catch (const Error& e) {
    if (e.code() == hcInvalidUsage || e.code() == hcRemoteError) throw;
  }
}

}  // namespace hicoll
