// The device engine's failure handling (the node's abort word, counters released) and its
// proxy thread (each collective's inter-node exchange, the stream watchdog, drain).
#include "device/hier_engine.h"

#include <chrono>

#include "base/deadline.h"
#include "base/error.h"
#include "base/log.h"

namespace hicoll::dev {
namespace {

using Clock = std::chrono::steady_clock;

long elapsedMs(Clock::time_point since) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

template <class Pass>
Progress progressOf(Pass& pass) {
  if constexpr (std::is_same_v<decltype(pass()), bool>) return pass() ? Progress::Done : Progress::Idle;
  else return pass();
}

}  // namespace

template <class Pass, class Timeout>
bool HierEngine::proxyWait(const Job& job, const char* during, const Deadline& bound, Pass&& pass, Timeout&& timeout) {
  bool stopped = false;
  std::string who;
  waitUntil(
      [&] {
        const Progress p = progressOf(pass);
        if (p != Progress::Idle || !(stop_ || failed_)) return p;
        stopped = true;
        return Progress::Done;
      },
      bound,
      [&] {
        if (nodeAborted(&who)) throwNodeFailed(job, who, during);
        checkOtherNodes(job);
      },
      timeout);
  return !stopped;
}

// ---- failure ----------------------------------------------------------------------------

void HierEngine::throwIfFailed() const {
  if (!failed_) return;
  std::lock_guard<std::mutex> lk(err_mu_);
  throw Error(err_code_ == hcSuccess ? hcInternalError : err_code_, fmt::format("device path failed: {}", err_));
}

void HierEngine::releaseCounters() {
  // Far enough ahead of every value any rank of the node can be waiting for.
  constexpr uint64_t kAhead = uint64_t{1} << 24;
  const uint32_t s = static_cast<uint32_t>(S_ + kAhead), x = static_cast<uint32_t>(X_ + kAhead),
                 j = static_cast<uint32_t>(J_ + kAhead);
  for (int p = 0; p < L_; ++p) {
    storeFlag(pub(p), s);
    storeFlag(cons(p), s);
  }
  for (Counter c : {Counter::Staged, Counter::Sent, Counter::Recvd, Counter::H2d}) storeFlag(mine(c), x);
  storeFlag(mine(Counter::Started), j);
  storeFlag(mine(Counter::Finished), j);
  storeFlag(mine(Counter::Agreed), j);
}

bool HierEngine::nodeAborted(std::string* who) const {
  const uint32_t v = loadFlag(res_.flags.abortWord());
  if (v == 0) return false;
  if (who) *who = fmt::format("rank {}", static_cast<long>(v) - 1);
  return true;
}

void HierEngine::abort(hcResult_t code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (failed_) return;
    err_code_ = code;
    err_ = why;
    failed_ = true;
  }
  HC_WARN("device path: {}", why);
  // Tell the node first, then unblock the streams: a peer whose collective completes because
  // of the release finds the abort word set and reports an error instead of a result.
  uint32_t expected = 0;
  __atomic_compare_exchange_n(res_.flags.abortWord().host, &expected, static_cast<uint32_t>(res_.rank + 1), false,
                              __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  releaseCounters();
  cv_.notify_all();  // the proxy aborts the network (it owns the transport)
  done_cv_.notify_all();
}

void HierEngine::throwNodeFailed(const Job& job, const std::string& who, const char* when) const {
  compareLocalDescs(job);
  HC_THROW(hcRemoteError, "{}: {} of this node failed{}", job.what, who, when);
}

void HierEngine::checkOtherNodes(const Job& job) {
  if (!res_.net) return;
  try {
    res_.net->checkFailureNotices();  // rate-limited by the transport
  } catch (const Error& e) {
    compareLocalDescs(job);
    HC_THROW(e.code(), "{}: {}", job.what, e.what());
  }
}

// ---- proxy thread ------------------------------------------------------------------------

void HierEngine::proxyMain() {
  ScopedLogRank log_rank(res_.rank);
  bool net_aborted = false;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || (failed_ && !net_aborted); });
      if (failed_ && !net_aborted) {
        net_aborted = true;
        lk.unlock();  // announcing takes up to half a second: enqueue and drain go on
        if (res_.net) {
          try {
            std::string why;
            {
              std::lock_guard<std::mutex> elk(err_mu_);
              why = err_;
            }
            // The other nodes learn it now rather than at their timeout (bounded, never throws).
            res_.net->announceFailure(fmt::format("rank {}: {}", res_.rank, why));
            res_.net->abort();
          } catch (const std::exception& e) {
            HC_WARN("device path: aborting the network: {}", e.what());
          }
        }
        lk.lock();
      }
      if (stop_) return;
      if (queue_.empty()) continue;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!failed_) {
      try {
        runJob(job);
      } catch (const Error& e) {
        abort(e.code(), e.what());
      } catch (const std::exception& e) {
        abort(hcInternalError, fmt::format("{}: {}", job.what, e.what()));
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      completed_ = job.id;
    }
    done_cv_.notify_all();
  }
}

void HierEngine::waitStream(const Job& job, Counter c, uint64_t v, const char* what) {
  const FlagRef f = mine(c);
  const std::string during = fmt::format(" while this rank waited for {}", what);
  proxyWait(
      job, during.c_str(), Deadline(res_.timeout_ms), [&] { return reached(loadFlag(f), static_cast<uint32_t>(v)); },
      [&] {
        HC_THROW(hcTimeout, "{}: rank {} waited {} ms for {} (HICOLL_TIMEOUT_MS); a peer of the node is stuck or gone",
                 job.what, res_.rank, res_.timeout_ms, what);
      });
}

void HierEngine::runJob(const Job& job) {
  // The stream reaches the collective after the user's earlier work, which may take any time:
  // this wait alone is unbounded (stop and failure end it). Everything after it is bounded.
  if (!proxyWait(
          job, "", Deadline::never(),
          [&] { return reached(loadFlag(mine(Counter::Started)), static_cast<uint32_t>(job.id)); }, [] {}))
    return;
  postDescs(job);
  bool agreed = false;
  const size_t K = job.steps.size();
  if (K > 0) {
    Transport& t = *res_.net;
    std::vector<size_t> left_r(K), left_s(K);
    struct Pending {
      ReqId id;
      size_t step;
      bool recv;
      int peer;
    };
    std::vector<Pending> pending;
    size_t post_r = 0, post_s = 0, done_r = 0, done_s = 0;
    const uint64_t tag_base = (job.id & 0xffffffffull) << 24;
    // Bounded by progress: the timeout counts from the last pass that moved something.
    Deadline bound(res_.timeout_ms);
    auto pass = [&] {
      if (done_r >= K && done_s >= K) return Progress::Done;
      bool moved = false;
      if (!agreed && pollDescs(job)) agreed = moved = true;
      // Receive into an hsort slot once the stream has copied out what it held.
      while (post_r < K) {
        const uint64_t x = job.steps[post_r].x;
        if (x > kDepth && !reached(loadFlag(mine(Counter::H2d)), static_cast<uint32_t>(x - kDepth))) break;
        for (const Xfer& r : job.steps[post_r].recvs)
          pending.push_back({t.irecv(r.peer, r.buf, r.len, tag_base | (post_r & 0xffffff)), post_r, true, r.peer});
        left_r[post_r] = job.steps[post_r].recvs.size();
        ++post_r;
        moved = true;
      }
      // Send from an hscratch slot once the stream has staged it.
      while (post_s < K) {
        if (!reached(loadFlag(mine(Counter::Staged)), static_cast<uint32_t>(job.steps[post_s].x))) break;
        for (const Xfer& s : job.steps[post_s].sends)
          pending.push_back({t.isend(s.peer, s.buf, s.len, tag_base | (post_s & 0xffffff)), post_s, false, s.peer});
        left_s[post_s] = job.steps[post_s].sends.size();
        ++post_s;
        moved = true;
      }
      try {
        if (completeEach(
                pending, [&](const Pending& p) { return t.test(p.id); },
                [&](const Pending& p) { --(p.recv ? left_r : left_s)[p.step]; }) > 0)
          moved = true;
      } catch (const Error&) {
        if (!agreed) pollDescs(job);  // a call that differs is the cause to name (e.g. a size mismatch)
        throw;
      }
      for (; done_r < post_r && left_r[done_r] == 0; ++done_r)
        storeFlag(mine(Counter::Recvd), static_cast<uint32_t>(job.steps[done_r].x));
      for (; done_s < post_s && left_s[done_s] == 0; ++done_s)
        storeFlag(mine(Counter::Sent), static_cast<uint32_t>(job.steps[done_s].x));
      if (!moved) return Progress::Idle;
      bound = Deadline(res_.timeout_ms);
      return Progress::Moved;
    };
    auto timeout = [&] {
      std::string peers;
      for (const Pending& p : pending) peers += fmt::format(" {}{}", p.recv ? "recv<-" : "send->", p.peer);
      HC_THROW(hcTimeout,
               "{}: rank {} made no network progress for {} ms (HICOLL_TIMEOUT_MS) at step {}/{} (posted recv {} "
               "send {}; pending:{}){}",
               job.what, res_.rank, res_.timeout_ms, std::min(done_r, done_s), K, post_r, post_s,
               peers.empty() ? " none, waiting for the stream" : peers,
               agreed ? "" : fmt::format("; no call descriptor yet from {}", missingDescs()));
    };
    if (!proxyWait(job, " during the inter-node exchange", bound, pass, timeout)) return;
  }
  // The peers' descriptors (on one node, or when the data finished first). Bounded: a peer
  // that never makes this call is named.
  if (!agreed && !proxyWait(
                     job, "", Deadline(res_.timeout_ms), [&] { return pollDescs(job); },
                     [&] {
                       HC_THROW(hcTimeout,
                                "{}: rank {} waited {} ms (HICOLL_TIMEOUT_MS) for the call of {}: not made, or stuck",
                                job.what, res_.rank, res_.timeout_ms, missingDescs());
                     }))
    return;
  waitStream(job, Counter::Finished, job.id, "its stream to finish the collective");
  waitNodeAgreed(job);
  std::string who;
  if (nodeAborted(&who)) throwNodeFailed(job, who, "");
}

// Every rank of the node has checked the call (against its node and its rails) before any
// reports it done: a difference only a local peer's rail sees fails this rank too (else the
// root of a Broadcast, whose node agrees, could return before a root that differs elsewhere
// reached it). Bounded once the peer's stream has reached the call; before, as long as ours.
void HierEngine::waitNodeAgreed(const Job& job) {
  const uint32_t id = static_cast<uint32_t>(job.id);
  storeFlag(mine(Counter::Agreed), id);
  for (int p = 0; p < L_; ++p) {
    if (p == l_) continue;
    // Bounded from when the peer's stream reached the call.
    Deadline bound(res_.timeout_ms);
    auto pass = [&] {
      if (reached(loadFlag(res_.flags.at(p, Counter::Agreed)), id)) return true;
      if (!reached(loadFlag(res_.flags.at(p, Counter::Started)), id)) bound = Deadline(res_.timeout_ms);
      return false;
    };
    if (!proxyWait(job, " while the node's ranks checked the call", bound, pass, [&] {
          HC_THROW(hcTimeout, "{}: rank {} waited {} ms (HICOLL_TIMEOUT_MS) for rank {} of its node to check the call",
                   job.what, res_.rank, res_.timeout_ms, res_.topo.rankAt(n_, p));
        }))
      return;
  }
}

void HierEngine::drain() {
  const uint64_t target = J_;
  uint64_t seen = completed_;
  auto last = Clock::now();
  // The proxy's waits are bounded by the timeout and name what they waited for; this bound
  // is the backstop for a stream that never reaches the collective at all.
  const long backstop_ms = 2 * res_.timeout_ms + 1000;
  std::unique_lock<std::mutex> lk(mu_);
  while (completed_ < target && !failed_) {
    done_cv_.wait_for(lk, std::chrono::milliseconds(20));
    if (completed_ != seen) {
      seen = completed_;
      last = Clock::now();
    } else if (elapsedMs(last) > backstop_ms) {
      lk.unlock();
      abort(hcTimeout,
            fmt::format("rank {}: device collectives {}..{} made no progress in {} ms (2 x HICOLL_TIMEOUT_MS); "
                        "its stream never reached them",
                        res_.rank, seen + 1, target, backstop_ms));
      break;
    }
  }
  if (lk.owns_lock()) lk.unlock();
  throwIfFailed();
}

}  // namespace hicoll::dev
