// The Agreement's explanation step against a scripted transport: what a failing request leaves
// behind, and which errors explain another one (a disagreement) or are only one more symptom
// (a link that broke meanwhile; the caller then waits for the failure notice behind it).
#include "algorithms/agree.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "base/error.h"

namespace hicoll {
namespace {

// Requests complete, fail, or stay pending as the test says; a released request tested again
// is an error, as in the real transports.
class ScriptedNet final : public Transport {
 public:
  struct Req {
    int peer;
    bool send;
    void* buf;
    size_t* received;
  };
  const char* name() const override { return "scripted"; }
  bool canConnect(int) const override { return true; }
  ReqId isend(int peer, const void*, size_t, uint64_t) override { return add({peer, true, nullptr, nullptr}); }
  ReqId irecv(int peer, void* buf, size_t, uint64_t) override { return add({peer, false, buf, nullptr}); }
  ReqId irecvUpTo(int peer, void* buf, size_t, uint64_t, size_t* received) override {
    return add({peer, false, buf, received});
  }
  bool test(ReqId id) override {
    auto it = live.find(id);
    HC_CHECK(it != live.end(), hcInvalidUsage, "test() of an unknown or already completed request {}", id);
    const Req r = it->second;
    if (r.send && broken.count(r.peer)) {
      live.erase(it);
      throw Error(hcRemoteError, "send to rank " + std::to_string(r.peer) + " failed: Broken pipe", Error::kSymptom);
    }
    if (r.send || !arrived.count(r.peer)) return false;
    std::memcpy(r.buf, &arrived[r.peer], sizeof(CallDesc));
    if (r.received) *r.received = sizeof(CallDesc) + AgreeState::Msg::kReason;
    live.erase(it);
    return true;
  }
  void progress() override {}
  void abort() override {}

  std::set<int> broken;             // sends to this peer fail (a closed link)
  std::map<int, CallDesc> arrived;  // this peer's descriptor has come
  std::map<ReqId, Req> live;

 private:
  ReqId add(Req r) {
    live[++next_] = r;
    return next_;
  }
  ReqId next_ = 0;
};

struct Fixture {
  Fixture() {
    id.rank = 0;
    id.nranks = 3;
    id.topo = Topology::build({"n0", "n1", "n2"}, {"h0", "h1", "h2"});
  }
  CallDesc call(uint64_t count) {
    CollArgs a{.coll = hcCollReduceScatter, .dtype = hcFloat32};
    a.count = count;
    a.call = 3;
    return CallDesc::of(a);
  }
  Identity id;
  ScriptedNet net;
  AgreeState st{{1, 2}, net};
};

TEST(Agreement, AFailedSendIsNotTestedAgain) {
  Fixture f;
  Agreement ag(f.id, &f.net, &f.st, f.call(100));
  f.net.broken.insert(1);
  try {
    ag.poll();
    FAIL() << "the broken link is not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcRemoteError);
    EXPECT_TRUE(e.symptom());
  }
  f.net.broken.clear();
  EXPECT_NO_THROW(EXPECT_FALSE(ag.poll()));  // rank 2's descriptor has not come
}

TEST(Agreement, ALinkThatBreaksWhileExplainingIsNotTheExplanation) {
  Fixture f;
  Agreement ag(f.id, &f.net, &f.st, f.call(100));
  f.net.broken.insert(1);
  EXPECT_NO_THROW(ag.explain(20));
}

TEST(Agreement, ExplainThrowsTheDisagreement) {
  Fixture f;
  Agreement ag(f.id, &f.net, &f.st, f.call(100));
  f.net.arrived[2] = f.call(200);
  try {
    ag.explain(1000);
    FAIL() << "the disagreement is not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("count"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hicoll
