// The NCCL fallback's dlopen table and forwarding, against libnccl_standin.so (a stand-in
// that records every call): symbols checked up front, errors as statuses, arguments, counts,
// datatypes and ops forwarded exactly, the communicator created lazily over the bootstrap.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <barrier>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "fallback/nccl/nccl_fallback.h"
#include "nccl_standin.h"

namespace {

using hicoll::CollArgs;
using hicoll::Error;
using hicoll::OpKind;
namespace nccl = hicoll::nccl;

// The stand-in's call log, reached through the same (refcounted) library handle.
class Standin {
 public:
  Standin() {
    h_ = dlopen(HCSTANDIN_PATH, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(h_, nullptr) << dlerror();
    count_ = reinterpret_cast<StandinCountFn>(dlsym(h_, "hcstandin_count"));
    call_ = reinterpret_cast<StandinCallFn>(dlsym(h_, "hcstandin_call"));
    reset_ = reinterpret_cast<StandinResetFn>(dlsym(h_, "hcstandin_reset"));
    fail_ = reinterpret_cast<StandinFailFn>(dlsym(h_, "hcstandin_fail"));
    reset_();
  }
  ~Standin() {
    reset_();
    dlclose(h_);
  }
  std::vector<StandinCall> calls(const std::string& fn = "") const {
    std::vector<StandinCall> v;
    for (int i = 0; i < count_(); ++i)
      if (fn.empty() || fn == call_(i)->fn) v.push_back(*call_(i));
    return v;
  }
  void fail(const char* fn, int code) { fail_(fn, code); }
  void reset() { reset_(); }

 private:
  void* h_ = nullptr;
  StandinCountFn count_;
  StandinCallFn call_;
  StandinResetFn reset_;
  StandinFailFn fail_;
};

// Rank 0 of n whose bootstrap answers alone (the other ranks' entries read as successes).
nccl::BootstrapOps soloOpsOf(int n) {
  nccl::BootstrapOps ops;
  ops.allgather = [n](const void* mine, void* all, size_t len) {
    for (int r = 0; r < n; ++r) std::memcpy(static_cast<char*>(all) + r * len, mine, len);
  };
  ops.broadcast = [](void*, size_t, int) {};
  return ops;
}

// A one-rank bootstrap.
nccl::BootstrapOps soloOps() {
  return soloOpsOf(1);
}

// Bootstrap collectives among threads of the test (ranks 0..n-1).
class ThreadBootstrap {
 public:
  explicit ThreadBootstrap(int n) : n_(n), bar_(n), slots_(n) {}
  nccl::BootstrapOps ops(int rank) {
    nccl::BootstrapOps o;
    o.allgather = [this, rank](const void* mine, void* all, size_t len) {
      slots_[rank].assign(static_cast<const char*>(mine), static_cast<const char*>(mine) + len);
      bar_.arrive_and_wait();
      for (int r = 0; r < n_; ++r) std::memcpy(static_cast<char*>(all) + r * len, slots_[r].data(), len);
      bar_.arrive_and_wait();
    };
    o.broadcast = [this, rank](void* data, size_t len, int root) {
      if (rank == root) slots_[root].assign(static_cast<char*>(data), static_cast<char*>(data) + len);
      bar_.arrive_and_wait();
      if (rank != root) std::memcpy(data, slots_[root].data(), len);
      bar_.arrive_and_wait();
    };
    return o;
  }

 private:
  int n_;
  std::barrier<> bar_;
  std::vector<std::vector<char>> slots_;
};

CollArgs args(hcColl_t coll, size_t count, hcDataType_t dt, OpKind op = OpKind::Sum, double scalar = 1.0) {
  static char send[64], recv[64];
  CollArgs a;
  a.coll = coll;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = dt;
  a.op.kind = op;
  a.op.scalar = scalar;
  a.stream = reinterpret_cast<void*>(0x5151);
  return a;
}

TEST(NcclLibrary, MissingLibraryIsSystemError) {
  try {
    nccl::Library::open("/nonexistent/libnccl.so.2");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcSystemError);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libnccl.so.2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HICOLL_NCCL_LIB"), std::string::npos) << e.what();
  }
}

TEST(NcclLibrary, MissingSymbolIsUnsupportedAndNamed) {
  try {
    nccl::Library::open(HCSTANDIN_NOALLREDUCE_PATH);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcUnsupported);
    EXPECT_NE(std::string(e.what()).find("ncclAllReduce"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("ncclAllGather"), std::string::npos) << e.what();
  }
}

TEST(NcclLibrary, ResolvesEverySymbolAndVersion) {
  Standin s;
  auto lib = nccl::Library::open(HCSTANDIN_PATH);
  EXPECT_EQ(lib->version(), 22809);
  EXPECT_EQ(lib->path(), HCSTANDIN_PATH);
  size_t n = 0;
  nccl::symbolNames(&n);
  EXPECT_EQ(n, 18u);
  const nccl::Functions& f = lib->fn();
  for (void* p :
       {(void*)f.getVersion, (void*)f.getUniqueId, (void*)f.commInitRank, (void*)f.commDestroy, (void*)f.commAbort,
        (void*)f.commGetAsyncError, (void*)f.getErrorString, (void*)f.getLastError, (void*)f.allGather,
        (void*)f.reduceScatter, (void*)f.allReduce, (void*)f.broadcast, (void*)f.redOpCreatePreMulSum,
        (void*)f.redOpDestroy, (void*)f.send, (void*)f.recv, (void*)f.groupStart, (void*)f.groupEnd})
    EXPECT_NE(p, nullptr);
  EXPECT_EQ(s.calls("ncclGetVersion").size(), 1u);
  EXPECT_EQ(lib->describe(nccl::InvalidArgument, nullptr), "standin error 4");
}

TEST(NcclLibrary, TooOldIsUnsupported) {
  Standin s;
  setenv("HCSTANDIN_VERSION", "21200", 1);
  try {
    nccl::Library::open(HCSTANDIN_PATH);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcUnsupported);
    EXPECT_NE(std::string(e.what()).find("2.12.0"), std::string::npos) << e.what();
  }
  unsetenv("HCSTANDIN_VERSION");
}

TEST(NcclMapping, DatatypesAndOps) {
  const std::pair<hcDataType_t, int> types[] = {{hcInt8, 0},    {hcUint8, 1},   {hcInt32, 2},   {hcUint32, 3},
                                                {hcInt64, 4},   {hcUint64, 5},  {hcFloat16, 6}, {hcFloat32, 7},
                                                {hcFloat64, 8}, {hcBfloat16, 9}};
  for (auto [h, n] : types) EXPECT_EQ(static_cast<int>(nccl::toNccl(h)), n) << hcTypeSize(h);
  EXPECT_EQ(nccl::toNccl(OpKind::Sum), nccl::Sum);
  EXPECT_EQ(nccl::toNccl(OpKind::Prod), nccl::Prod);
  EXPECT_EQ(nccl::toNccl(OpKind::Max), nccl::Max);
  EXPECT_EQ(nccl::toNccl(OpKind::Min), nccl::Min);
  EXPECT_EQ(nccl::toNccl(OpKind::Avg), nccl::Avg);
  EXPECT_THROW(nccl::toNccl(static_cast<hcDataType_t>(42)), Error);
}

// NCCL has no bitwise ops: no enum is made up for them; a call fails hcUnsupported naming the
// op, before NCCL is even loaded.
TEST(NcclMapping, BitwiseOpsAreUnsupported) {
  for (OpKind op : {OpKind::Band, OpKind::Bor, OpKind::Bxor}) {
    try {
      nccl::toNccl(op);
      ADD_FAILURE() << hicoll::opName(op) << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), hcUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(hicoll::opName(op)), std::string::npos) << e.what();
    }
  }
  Standin s;
  nccl::Fallback fb(HCSTANDIN_PATH, 0, 1, soloOps());
  for (hcColl_t coll : {hcCollAllReduce, hcCollReduceScatter}) {
    try {
      fb.run(args(coll, 4, hcInt32, OpKind::Bxor));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), hcUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("bxor"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fb.initialized());
  EXPECT_TRUE(s.calls().empty());
}

TEST(NcclFallback, LazyAndForwardsExactly) {
  Standin s;
  {
    nccl::Fallback fb(HCSTANDIN_PATH, 0, 1, soloOps());
    EXPECT_FALSE(fb.initialized());
    EXPECT_TRUE(s.calls().empty()) << "the library is loaded only when a call falls back";

    CollArgs ag = args(hcCollAllGather, 7, hcBfloat16);
    fb.run(ag);
    EXPECT_TRUE(fb.initialized());
    ASSERT_EQ(s.calls("ncclGetUniqueId").size(), 1u);
    auto init = s.calls("ncclCommInitRank");
    ASSERT_EQ(init.size(), 1u);
    EXPECT_EQ(init[0].nranks, 1);
    EXPECT_EQ(init[0].rank, 0);
    EXPECT_STREQ(init[0].id, s.calls("ncclGetUniqueId")[0].id);
    void* comm = init[0].comm;
    auto c = s.calls("ncclAllGather");
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].send, ag.send);
    EXPECT_EQ(c[0].recv, ag.recv);
    EXPECT_EQ(c[0].count, 7u);
    EXPECT_EQ(c[0].dtype, 9);
    EXPECT_EQ(c[0].comm, comm);
    EXPECT_EQ(c[0].stream, ag.stream);

    fb.run(args(hcCollReduceScatter, 3, hcFloat16, OpKind::Max));
    fb.run(args(hcCollAllReduce, 11, hcUint64, OpKind::Avg));
    CollArgs bc = args(hcCollBroadcast, 5, hcInt8);
    bc.root = 0;
    fb.run(bc);
    auto rs = s.calls("ncclReduceScatter");
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_EQ(rs[0].count, 3u);
    EXPECT_EQ(rs[0].dtype, 6);
    EXPECT_EQ(rs[0].op, nccl::Max);
    auto ar = s.calls("ncclAllReduce");
    ASSERT_EQ(ar.size(), 1u);
    EXPECT_EQ(ar[0].count, 11u);
    EXPECT_EQ(ar[0].dtype, 5);
    EXPECT_EQ(ar[0].op, nccl::Avg);
    auto b = s.calls("ncclBroadcast");
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(b[0].count, 5u);
    EXPECT_EQ(b[0].root, 0);
    EXPECT_EQ(b[0].dtype, 0);
    // The communicator's health is checked before every collective.
    EXPECT_EQ(s.calls("ncclCommGetAsyncError").size(), 4u);
    EXPECT_EQ(s.calls("ncclCommInitRank").size(), 1u) << "created once";
  }
  auto d = s.calls("ncclCommDestroy");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(s.calls("ncclCommAbort").empty());
}

// Device point-to-point (hcSend / hcRecv with a stream) on NCCL: the communicator is created
// before a group opens (a creation inside a group would wait for its end), the group opens at
// the first grouped operation and closes once, and a failure names the call.
TEST(NcclFallback, PointToPointForwardsAndGroupsAfterCreation) {
  Standin s;
  nccl::Fallback fb(HCSTANDIN_PATH, 0, 2, soloOpsOf(2));
  static char sbuf[64], rbuf[64];
  void* stream = reinterpret_cast<void*>(0x7171);
  fb.sendRecv(true, sbuf, 5, hcFloat32, 1, stream, /*grouped=*/true);
  fb.sendRecv(false, rbuf, 6, hcInt64, 1, stream, /*grouped=*/true);
  fb.endGroup();
  fb.endGroup();  // nothing open: nothing called
  fb.sendRecv(true, sbuf, 2, hcUint8, 0, stream, /*grouped=*/false);
  std::vector<std::string> order;
  for (const StandinCall& c : s.calls())
    if (std::string(c.fn) != "ncclGetVersion" && std::string(c.fn) != "ncclCommGetAsyncError") order.push_back(c.fn);
  const std::vector<std::string> expected = {"ncclGetUniqueId", "ncclCommInitRank", "ncclGroupStart", "ncclSend",
                                             "ncclRecv",        "ncclGroupEnd",     "ncclSend"};
  EXPECT_EQ(order, expected);
  auto sends = s.calls("ncclSend");
  ASSERT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends[0].send, sbuf);
  EXPECT_EQ(sends[0].count, 5u);
  EXPECT_EQ(sends[0].dtype, nccl::Float32);
  EXPECT_EQ(sends[0].root, 1);
  EXPECT_EQ(sends[0].stream, stream);
  EXPECT_EQ(sends[1].root, 0);
  auto recvs = s.calls("ncclRecv");
  ASSERT_EQ(recvs.size(), 1u);
  EXPECT_EQ(recvs[0].recv, rbuf);
  EXPECT_EQ(recvs[0].count, 6u);
  EXPECT_EQ(recvs[0].dtype, nccl::Int64);
  EXPECT_EQ(recvs[0].root, 1);

  s.fail("ncclRecv", nccl::InvalidArgument);
  try {
    fb.sendRecv(false, rbuf, 3, hcBfloat16, 1, stream, false);
    FAIL() << "a failing ncclRecv is not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("ncclRecv"), std::string::npos) << m;
    EXPECT_NE(m.find("a receive of 3 x bfloat16 from rank 1"), std::string::npos) << m;
  }
}

TEST(NcclFallback, PreMulSumCreatesAndDestroysAnOpPerCall) {
  Standin s;
  nccl::Fallback fb(HCSTANDIN_PATH, 0, 1, soloOps());
  struct Case {
    hcDataType_t dt;
    double scalar;
    std::vector<unsigned char> bytes;
  } cases[] = {
      {hcFloat16, 0.5, {0x00, 0x38}},
      {hcBfloat16, -2.0, {0x00, 0xc0}},
      {hcFloat32, 0.25, {0x00, 0x00, 0x80, 0x3e}},
      {hcFloat64, 3.0, {0, 0, 0, 0, 0, 0, 0x08, 0x40}},
      {hcInt32, 7.0, {7, 0, 0, 0}},
      {hcUint8, 200.0, {200}},
  };
  int i = 0;
  for (const Case& c : cases) {
    fb.run(args(i % 2 ? hcCollAllReduce : hcCollReduceScatter, 4, c.dt, OpKind::PreMulSum, c.scalar));
    auto created = s.calls("ncclRedOpCreatePreMulSum");
    ASSERT_EQ(created.size(), static_cast<size_t>(i + 1));
    const StandinCall& cr = created.back();
    EXPECT_EQ(cr.dtype, static_cast<int>(nccl::toNccl(c.dt)));
    EXPECT_EQ(cr.residence, nccl::ScalarHostImmediate);
    EXPECT_EQ(std::vector<unsigned char>(cr.scalar, cr.scalar + c.bytes.size()), c.bytes) << "case " << i;
    auto used = s.calls(i % 2 ? "ncclAllReduce" : "ncclReduceScatter");
    EXPECT_EQ(used.back().op, cr.op);
    EXPECT_GE(cr.op, nccl::NumOps);
    auto destroyed = s.calls("ncclRedOpDestroy");
    ASSERT_EQ(destroyed.size(), static_cast<size_t>(i + 1));
    EXPECT_EQ(destroyed.back().op, cr.op);
    ++i;
  }
}

TEST(NcclFallback, ErrorsBecomeStatusesWithNcclText) {
  Standin s;
  nccl::Fallback fb(HCSTANDIN_PATH, 0, 1, soloOps());
  fb.run(args(hcCollAllGather, 1, hcFloat32));
  s.fail("ncclAllReduce", nccl::InvalidArgument);
  try {
    fb.run(args(hcCollAllReduce, 2, hcFloat32));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("ncclAllReduce"), std::string::npos) << m;
    EXPECT_NE(m.find("standin error 4"), std::string::npos) << m;
    EXPECT_NE(m.find("standin last error"), std::string::npos) << m;
  }
  s.fail("ncclAllReduce", nccl::SystemError);
  try {
    fb.run(args(hcCollAllReduce, 2, hcFloat32));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcSystemError);
  }
  s.fail("async", nccl::RemoteError);
  try {
    fb.run(args(hcCollAllGather, 2, hcFloat32));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcRemoteError);
    EXPECT_NE(std::string(e.what()).find("failed earlier"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.calls("ncclAllGather").size(), 1u) << "nothing is enqueued on a failed NCCL communicator";
  s.fail("async", 0);
  CollArgs barrier = args(hcCollBarrier, 1, hcFloat32);
  try {
    fb.run(barrier);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), hcInvalidUsage);
  }
  fb.abort();
}

TEST(NcclFallback, AbortDestroysWithCommAbort) {
  Standin s;
  {
    nccl::Fallback fb(HCSTANDIN_PATH, 0, 1, soloOps());
    fb.run(args(hcCollAllGather, 1, hcFloat32));
    fb.abort();
  }
  EXPECT_EQ(s.calls("ncclCommAbort").size(), 1u);
  EXPECT_TRUE(s.calls("ncclCommDestroy").empty());
}

TEST(NcclFallback, FailedInitIsRepeatedNotRetried) {
  Standin s;
  s.fail("ncclCommInitRank", nccl::SystemError);
  nccl::Fallback fb(HCSTANDIN_PATH, 0, 1, soloOps());
  for (int i = 0; i < 2; ++i) {
    try {
      fb.run(args(hcCollAllGather, 1, hcFloat32));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), hcSystemError);
      EXPECT_NE(std::string(e.what()).find("ncclCommInitRank"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(s.calls("ncclCommInitRank").size(), 1u);
}

TEST(NcclFallback, UniqueIdTravelsOverTheBootstrap) {
  Standin s;
  constexpr int kRanks = 3;
  ThreadBootstrap bs(kRanks);
  std::vector<std::thread> ranks;
  std::vector<std::string> errors(kRanks);
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      try {
        nccl::Fallback fb(HCSTANDIN_PATH, r, kRanks, bs.ops(r));
        CollArgs a = args(hcCollAllGather, 2, hcInt32);
        fb.run(a);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  auto ids = s.calls("ncclGetUniqueId");
  ASSERT_EQ(ids.size(), 1u) << "only rank 0 makes the id";
  auto inits = s.calls("ncclCommInitRank");
  ASSERT_EQ(inits.size(), static_cast<size_t>(kRanks));
  std::vector<bool> seen(kRanks);
  for (const StandinCall& c : inits) {
    EXPECT_EQ(c.nranks, kRanks);
    ASSERT_GE(c.rank, 0);
    ASSERT_LT(c.rank, kRanks);
    seen[c.rank] = true;
    EXPECT_STREQ(c.id, ids[0].id);
  }
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(seen[r]);
}

TEST(NcclFallback, ALoadFailureOnOneRankFailsEveryRank) {
  Standin s;
  constexpr int kRanks = 2;
  ThreadBootstrap bs(kRanks);
  std::vector<hcResult_t> codes(kRanks, hcSuccess);
  std::vector<std::string> msgs(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      try {
        nccl::Fallback fb(r == 1 ? "/nonexistent/libnccl.so.2" : HCSTANDIN_PATH, r, kRanks, bs.ops(r));
        fb.run(args(hcCollAllGather, 2, hcInt32));
      } catch (const Error& e) {
        codes[r] = e.code();
        msgs[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(codes[1], hcSystemError) << msgs[1];
  EXPECT_EQ(codes[0], hcRemoteError) << msgs[0];
  EXPECT_NE(msgs[0].find("rank 1"), std::string::npos) << msgs[0];
  EXPECT_TRUE(s.calls("ncclCommInitRank").empty()) << "nobody enters NCCL's init when a rank cannot";
}

// The device run's one_rank_scratch_fallback failure: AllReduce of 4097 float32 avg / premulsum
// on one rank left element 4096 unwritten. NCCL 2.19.1-2.29.2 run one-rank pre-multiplied sums
// (and floating-point avg) with oneRankReduce, whose blocks skip the last count mod bn
// elements when count / bn is already a multiple of the 16-byte pack. The stand-in executes
// one-rank reductions like that (HCSTANDIN_EXECUTE=1) and every element must come out right.
TEST(NcclFallback, OneRankReductionsWriteEveryElementOnEveryNcclVersion) {
  EXPECT_EQ(nccl::oneRankKernelCovers(4097, 4), 4096u);
  EXPECT_EQ(nccl::oneRankKernelCovers(4096, 4), 4096u);
  EXPECT_EQ(nccl::oneRankKernelCovers(4000, 4), 4000u) << "one block covers everything";
  EXPECT_EQ(nccl::oneRankKernelCovers(300001, 4), 300001u);
  EXPECT_EQ(nccl::oneRankKernelCovers(0, 4), 0u);
  setenv("HCSTANDIN_EXECUTE", "1", 1);
  struct Op {
    OpKind kind;
    double scalar, factor;
  } ops[] = {{OpKind::Avg, 1.0, 1.0}, {OpKind::PreMulSum, 0.5, 0.5}, {OpKind::Sum, 1.0, 1.0}};
  for (const char* version : {"22809", "21903", "22902", "22907", "21805"}) {
    setenv("HCSTANDIN_VERSION", version, 1);
    Standin s;
    nccl::Fallback fb(HCSTANDIN_PATH, 0, 1, soloOps());
    for (hcColl_t coll : {hcCollAllReduce, hcCollReduceScatter})
      for (size_t count : {size_t{4097}, size_t{1}, size_t{8195}, size_t{16386}, size_t{131075}, size_t{300001}})
        for (const Op& op : ops)
          for (bool in_place : {false, true})
            for (hcDataType_t dt : {hcFloat32, hcFloat64}) {
              const size_t es = hcTypeSize(dt);
              std::vector<double> want(count);
              std::vector<char> send(count * es), recv(count * es);
              for (size_t i = 0; i < count; ++i) {
                const double x = -1.0 - static_cast<double>(i % 7);
                want[i] = x * op.factor;
                if (dt == hcFloat32) reinterpret_cast<float*>(send.data())[i] = static_cast<float>(x);
                else reinterpret_cast<double*>(send.data())[i] = x;
              }
              CollArgs a = args(coll, count, dt, op.kind, op.scalar);
              a.send = send.data();
              a.recv = in_place ? send.data() : recv.data();
              fb.run(a);
              const char* out = in_place ? send.data() : recv.data();
              size_t wrong = 0, first = count;
              for (size_t i = 0; i < count; ++i) {
                const double got =
                    dt == hcFloat32 ? reinterpret_cast<const float*>(out)[i] : reinterpret_cast<const double*>(out)[i];
                if (got != want[i] && wrong++ == 0) first = i;
              }
              EXPECT_EQ(wrong, 0u) << "NCCL " << version << " " << hicoll::describe(a) << " op "
                                   << hicoll::opName(op.kind) << (in_place ? " in place" : "")
                                   << ": first wrong element " << first;
            }
  }
  unsetenv("HCSTANDIN_VERSION");
  unsetenv("HCSTANDIN_EXECUTE");
}

}  // namespace
