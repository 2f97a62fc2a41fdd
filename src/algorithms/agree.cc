#include "algorithms/agree.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "algorithms/run.h"
#include "base/error.h"

namespace hicoll {
namespace {
constexpr size_t kHeader = sizeof(CallDesc);
constexpr size_t kStandaloneBytes = kHeader + AgreeState::Msg::kReason;
}  // namespace

bool Agreement::canPiggyback(size_t first_message_bytes) {
  return first_message_bytes <= AgreeState::Msg::kBody;
}

AgreeState::AgreeState(std::vector<int> agreement_peers, Transport& net)
    : peers(std::move(agreement_peers)), in(peers.size()), out(peers.size()), got(peers.size()) {
  for (auto* v : {&in, &out})
    if (!v->empty()) net.registerRegion(v->data(), v->size() * sizeof(Msg));
}

Agreement::Agreement(const Identity& id, Transport* net, AgreeState* state, const CallDesc& mine,
                     const std::string& reason, bool piggyback)
    : id_(id), net_(net), st_(state), mine_(mine) {
  if (!st_ || st_->peers.empty() || !net_ || net_->tagBits() < tags::kTagBits) return;
  AgreeState& c = *st_;
  const size_t P = c.peers.size();
  left_ = P;
  if (piggyback) {
    piggyback_ = true;
    sent_.assign(P, 0);
    received_.assign(P, 0);
    std::fill(c.got.begin(), c.got.end(), 0);
    return;
  }
  const uint64_t tag = agreementTag(mine.w[3]);
  recvs_.assign(P, 0);
  std::fill(c.got.begin(), c.got.end(), 0);
  for (size_t i = 0; i < P; ++i) {
    AgreeState::Msg& out = c.out[i];
    out.desc = mine;
    std::snprintf(out.body, AgreeState::Msg::kReason, "%s", reason.c_str());
    c.in[i].desc = CallDesc{};  // a size mismatch must not show the last call's
    // Up to a whole staging message: a peer whose call differs may have piggybacked.
    recvs_[i] = net_->irecvUpTo(c.peers[i], &c.in[i], sizeof(AgreeState::Msg), tag, &c.got[i]);
    sends_.push_back(net_->isend(c.peers[i], &out, kStandaloneBytes, tag));
  }
  left_ += sends_.size();
}

std::vector<int> Agreement::missing() const {
  std::vector<int> peers;
  for (size_t i = 0; i < recvs_.size(); ++i)
    if (recvs_[i] != 0) peers.push_back(st_->peers[i]);
  return peers;
}

int Agreement::indexOf(int peer) const {
  auto it = std::find(st_->peers.begin(), st_->peers.end(), peer);
  return it == st_->peers.end() ? -1 : static_cast<int>(it - st_->peers.begin());
}

int Agreement::stageSend(int peer, const void*& buf, size_t& len, uint64_t& tag) {
  const int i = piggyback_ ? indexOf(peer) : -1;
  if (i < 0 || sent_[i]) return -1;
  HC_CHECK(canPiggyback(len), hcInternalError, "agreement: a first message of {} bytes cannot carry the descriptor",
           len);
  sent_[i] = 1;
  AgreeState::Msg& out = st_->out[i];
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
  HC_CHECK(canPiggyback(len), hcInternalError, "agreement: a first message of {} bytes cannot carry the descriptor",
           len);
  received_[i] = 1;
  st_->in[i].desc = CallDesc{};
  buf = &st_->in[i];
  len = sizeof(AgreeState::Msg);
  st_->got[i] = 0;
  received = &st_->got[i];
  tag = agreementTag(mine_.w[3]);
  return i;
}

void Agreement::landed(int index, void* dst, size_t len) {
  --left_;
  const size_t got = st_->got[index];
  if (got < kHeader) st_->in[index].desc = CallDesc{};  // no descriptor: shows as a disagreement
  check(static_cast<size_t>(index));
  // The same call sends the same first message; anything else is a bug, not a user error.
  HC_CHECK(got == kHeader + len, hcInternalError, "{} sent a first message of {} bytes where {} were due ({})",
           id_.who(st_->peers[index]), got, kHeader + len, describeCall(mine_));
  if (len) std::memcpy(dst, st_->in[index].body, len);
}

void Agreement::failed(int index) {
  // The message arrived with another length: its first bytes are the peer's descriptor.
  const CallDesc& theirs = st_->in[index].desc;
  if (theirs.w[3] != 0 && !theirs.sameCall(mine_)) check(static_cast<size_t>(index));
}

void Agreement::check(size_t i) {
  const AgreeState::Msg& m = st_->in[i];
  const int peer = st_->peers[i];
  if (m.desc.invalid()) {
    if (mine_.invalid()) return;
    const std::string why(m.body, strnlen(m.body, AgreeState::Msg::kReason));
    HC_THROW(hcRemoteError, "{} rejected its arguments of {}{}{}", id_.who(peer), describeCall(m.desc),
             why.empty() ? "" : ": ", why);
  }
  any_valid_ = true;
  if (mine_.invalid() || m.desc.sameCall(mine_)) return;
  if ((m.desc.flags() ^ mine_.flags()) & CallDesc::kDestroy)
    HC_THROW(hcRemoteError, "{} {}", id_.who(peer),
             m.desc.flags() & CallDesc::kDestroy
                 ? fmt::format("destroyed its communicator while rank {} called {}", id_.rank, describeCall(mine_))
                 : fmt::format("called {} while this rank destroys its communicator", describeCall(m.desc)));
  HC_THROW(hcInvalidUsage, "{}", callMismatch(id_.who(peer), m.desc, id_.rank, mine_));
}

bool Agreement::poll(bool collect) {
  if (left_ == 0 || piggyback_) return left_ == 0;
  for (size_t i = 0; i < recvs_.size(); ++i) {
    if (recvs_[i] == 0) continue;
    bool done = false;
    try {
      done = net_->test(recvs_[i]);
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
  // A send that failed leaves the list with its error, so that a later poll (explain) does
  // not test a request the transport already released.
  std::optional<Error> failed;
  left_ -= completeEach(sends_, [&](ReqId s) {
    try {
      return net_->test(s);
    } catch (const Error& e) {
      if (!failed) failed = e;
      return true;
    }
  });
  if (failed) throw *failed;
  return left_ == 0;
}

void Agreement::finish(Run& r, bool collect) {
  if (left_ == 0) return;  // no agreement peers (one node), or every descriptor already in
  if (piggyback_) {
    HC_CHECK(left_ == 0, hcInternalError, "agreement: {} agreement peer(s) exchanged no message in {}", left_,
             describeCall(mine_));
    return;
  }
  r.waitUntil("waiting for the agreement peers' call descriptors", [&] { return poll(collect); });
}

void Agreement::explain(long ms) {
  if (left_ == 0 || piggyback_) return;
  try {
    waitUntil([&] { return poll(); }, Deadline(ms));
  } catch (const Error& e) {
    // A disagreement or a peer's own report explains the error; a link that broke meanwhile
    // is one more symptom, and the caller's error stays (the caller then waits for its cause).
    if (e.code() == hcInvalidUsage || (e.code() == hcRemoteError && !e.symptom())) throw;
  }
}

}  // namespace hicoll
