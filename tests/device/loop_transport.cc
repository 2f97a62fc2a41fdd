#include "loop_transport.h"

#include <cstring>
#include <deque>
#include <map>

#include "base/error.h"

namespace hctest {

struct LoopFabric::Message {
  uint64_t tag;
  std::vector<char> data;
  std::shared_ptr<bool> delivered;
};

struct LoopFabric::Recv {
  uint64_t tag;
  void* buf;
  size_t len;
  std::shared_ptr<bool> done;
};

struct LoopFabric::Box {
  std::deque<Message> msgs;
  std::deque<Recv> recvs;  // posted, not yet matched, in posting order
};

class LoopTransport : public hicoll::Transport {
 public:
  LoopTransport(std::shared_ptr<LoopFabric> f, int rank) : f_(std::move(f)), rank_(rank) {}
  const char* name() const override { return "loop"; }
  bool canConnect(int peer) const override { return peer >= 0 && peer < f_->nranks_ && peer != rank_; }

  hicoll::ReqId isend(int peer, const void* buf, size_t len, uint64_t tag) override {
    check(peer);
    auto delivered = std::make_shared<bool>(false);
    {
      std::lock_guard<std::mutex> lk(f_->mu_);
      LoopFabric::Message m{tag, std::vector<char>(static_cast<const char*>(buf), static_cast<const char*>(buf) + len),
                            delivered};
      f_->boxes_[peer * f_->nranks_ + rank_]->msgs.push_back(std::move(m));
    }
    reqs_[next_] = Req{peer, delivered, false, tag};
    return next_++;
  }

  hicoll::ReqId irecv(int peer, void* buf, size_t len, uint64_t tag) override {
    check(peer);
    auto done = std::make_shared<bool>(false);
    {
      std::lock_guard<std::mutex> lk(f_->mu_);
      f_->boxes_[rank_ * f_->nranks_ + peer]->recvs.push_back({tag, buf, len, done});
    }
    reqs_[next_] = Req{peer, done, true, tag};
    return next_++;
  }

  bool test(hicoll::ReqId id) override {
    HC_CHECK(!aborted_, hcRemoteError, "loop transport of rank {} was aborted", rank_);
    auto it = reqs_.find(id);
    HC_CHECK(it != reqs_.end(), hcInternalError, "loop transport: unknown request {}", id);
    progress();
    std::lock_guard<std::mutex> lk(f_->mu_);
    if (!*it->second.done) return false;
    reqs_.erase(it);
    return true;
  }

  void progress() override {
    std::lock_guard<std::mutex> lk(f_->mu_);
    for (int src = 0; src < f_->nranks_; ++src) {
      LoopFabric::Box& b = *f_->boxes_[rank_ * f_->nranks_ + src];
      for (auto r = b.recvs.begin(); r != b.recvs.end();) {
        auto m = b.msgs.begin();
        while (m != b.msgs.end() && m->tag != r->tag) ++m;
        if (m == b.msgs.end()) {
          ++r;
          continue;
        }
        HC_CHECK(m->data.size() == r->len, hcInvalidUsage,
                 "loop transport: rank {} posted {} bytes for tag {:#x} from rank {}, which sent {}", rank_, r->len,
                 r->tag, src, m->data.size());
        std::memcpy(r->buf, m->data.data(), r->len);
        *r->done = true;
        *m->delivered = true;
        b.msgs.erase(m);
        r = b.recvs.erase(r);
      }
    }
  }

  void abort() override { aborted_ = true; }

  void announceFailure(const std::string& what) override {
    std::lock_guard<std::mutex> lk(f_->mu_);
    for (int p = 0; p < f_->nranks_; ++p)
      if (p != rank_ && f_->notices_[p].empty())
        f_->notices_[p] = fmt::format("rank {} reported a failure: {}", rank_, what);
  }

  void checkFailureNotices() override {
    std::string n;
    {
      std::lock_guard<std::mutex> lk(f_->mu_);
      n = f_->notices_[rank_];
    }
    if (!n.empty()) HC_THROW(hcRemoteError, "{}", n);
  }

 private:
  struct Req {
    int peer;
    std::shared_ptr<bool> done;
    bool recv;
    uint64_t tag;
  };
  void check(int peer) const {
    HC_CHECK(!aborted_, hcRemoteError, "loop transport of rank {} was aborted", rank_);
    HC_CHECK(canConnect(peer), hcInvalidArgument, "loop transport: rank {} cannot reach {}", rank_, peer);
  }
  std::shared_ptr<LoopFabric> f_;
  int rank_;
  bool aborted_ = false;
  std::map<hicoll::ReqId, Req> reqs_;
  hicoll::ReqId next_ = 1;
};

LoopFabric::LoopFabric(int nranks) : nranks_(nranks), notices_(nranks) {
  for (int i = 0; i < nranks * nranks; ++i) boxes_.push_back(std::make_unique<Box>());
}

std::shared_ptr<LoopFabric> LoopFabric::create(int nranks) {
  return std::shared_ptr<LoopFabric>(new LoopFabric(nranks));
}

std::unique_ptr<hicoll::Transport> LoopFabric::endpoint(int rank) {
  return std::make_unique<LoopTransport>(shared_from_this(), rank);
}

}  // namespace hctest
