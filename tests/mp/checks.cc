#include "checks.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../common/reference.h"

namespace hctest {
namespace {

int report(hcResult_t r, const char* what, int rank) {
  if (r == hcSuccess) return 0;
  std::fprintf(stderr, "[rank %d] %s returned %s: %s\n", rank, what, hcGetErrorString(r), hcGetLastError(nullptr));
  return 1;
}

struct Ctx {
  int rank, W;
  explicit Ctx(hcComm_t c) {
    hcCommUserRank(c, &rank);
    hcCommCount(c, &W);
  }
};

// For a pre-multiplied sum the op handle is made per call; op_kind -1 in the reference.
struct Op {
  hcRedOp_t op;
  int kind;
  double scalar;
  hcComm_t comm;
  bool made = false;
  Op(hcComm_t c, hcDataType_t t, hcRedOp_t builtin) : op(builtin), kind(builtin), scalar(1), comm(c) {
    if (builtin == hcNumOps) {
      scalar = premulScalar(t);
      std::vector<char> s(8);
      store(s.data(), t, 0, scalar);
      made = hcRedOpCreatePreMulSum(&op, s.data(), t, c) == hcSuccess;
      kind = -1;
    }
  }
  ~Op() {
    if (made) hcRedOpDestroy(op, comm);
  }
  hcRedOp_t inputKind() const { return kind == hcProd || isBitwise(kind) ? static_cast<hcRedOp_t>(kind) : hcSum; }
};

bool g_node_memory = false;

// A test buffer: a vector, or node memory (hcMemAlloc) when the checks run on it.
class Buf {
 public:
  explicit Buf(size_t n, char fill = 0) : n_(n) {
    if (g_node_memory) {
      if (hcMemAlloc(reinterpret_cast<void**>(&p_), n) != hcSuccess) std::abort();
      std::memset(p_, fill, n);
    } else {
      v_.assign(n, fill);
      p_ = v_.data();
    }
  }
  ~Buf() {
    if (g_node_memory) hcMemFree(p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  char* data() { return p_; }
  char back() const { return p_[n_ - 1]; }

 private:
  std::vector<char> v_;
  char* p_ = nullptr;
  size_t n_;
};

}  // namespace

void useNodeMemory(bool on) {
  g_node_memory = on;
}

int checkAllGather(hcComm_t comm, hcDataType_t t, size_t count, bool in_place, int salt) {
  Ctx x(comm);
  const size_t e = hcTypeSize(t);
  Buf out(count * x.W * e + 1, 0x5a), in(count * e + 1);
  void* send = in_place ? out.data() + x.rank * count * e : in.data();
  for (size_t i = 0; i < count; ++i) store(send, t, i, inputValue(t, hcSum, x.rank, i, salt));
  std::string what =
      std::string("AllGather ") + typeName(t) + " count " + std::to_string(count) + (in_place ? " in place" : "");
  if (report(hcAllGather(send, out.data(), count, t, comm, nullptr), what.c_str(), x.rank)) return 1;
  Checker ck{what, x.rank};
  for (int r = 0; r < x.W; ++r)
    for (size_t i = 0; i < count; ++i)
      ck.check(t, r * count + i, load(out.data(), t, r * count + i), inputValue(t, hcSum, r, i, salt));
  if (static_cast<unsigned char>(out.back()) != 0x5a) ck.check(t, count * x.W, 1, 0);  // wrote past the end
  return ck.wrong ? 1 : 0;
}

int checkReduceScatter(hcComm_t comm, hcDataType_t t, hcRedOp_t builtin, size_t count, bool in_place, int salt) {
  Ctx x(comm);
  Op op(comm, t, builtin);
  const size_t e = hcTypeSize(t);
  Buf in(count * x.W * e + 1), out(count * e + 1, 0x5a);
  for (size_t i = 0; i < count * x.W; ++i) store(in.data(), t, i, inputValue(t, op.inputKind(), x.rank, i, salt));
  void* recv = in_place ? in.data() + x.rank * count * e : out.data();
  std::string what = std::string("ReduceScatter ") + typeName(t) + " " + opName(builtin) + " count " +
                     std::to_string(count) + (in_place ? " in place" : "");
  if (report(hcReduceScatter(in.data(), recv, count, t, op.op, comm, nullptr), what.c_str(), x.rank)) return 1;
  Checker ck{what, x.rank};
  std::vector<double> vals(x.W);
  for (size_t i = 0; i < count; ++i) {
    const size_t gi = x.rank * count + i;
    for (int r = 0; r < x.W; ++r) vals[r] = inputValue(t, op.inputKind(), r, gi, salt);
    ck.check(t, i, load(recv, t, i), expectedReduce(t, op.kind, vals, op.scalar));
  }
  if (!in_place && static_cast<unsigned char>(out.back()) != 0x5a) ck.check(t, count, 1, 0);
  return ck.wrong ? 1 : 0;
}

int checkAllReduce(hcComm_t comm, hcDataType_t t, hcRedOp_t builtin, size_t count, bool in_place, int salt) {
  Ctx x(comm);
  Op op(comm, t, builtin);
  const size_t e = hcTypeSize(t);
  Buf in(count * e + 1), out(count * e + 1, 0x5a);
  for (size_t i = 0; i < count; ++i) store(in.data(), t, i, inputValue(t, op.inputKind(), x.rank, i, salt));
  void* recv = in_place ? in.data() : out.data();
  std::string what = std::string("AllReduce ") + typeName(t) + " " + opName(builtin) + " count " +
                     std::to_string(count) + (in_place ? " in place" : "");
  if (report(hcAllReduce(in.data(), recv, count, t, op.op, comm, nullptr), what.c_str(), x.rank)) return 1;
  Checker ck{what, x.rank};
  std::vector<double> vals(x.W);
  for (size_t i = 0; i < count; ++i) {
    for (int r = 0; r < x.W; ++r) vals[r] = inputValue(t, op.inputKind(), r, i, salt);
    ck.check(t, i, load(recv, t, i), expectedReduce(t, op.kind, vals, op.scalar));
  }
  if (!in_place && static_cast<unsigned char>(out.back()) != 0x5a) ck.check(t, count, 1, 0);
  return ck.wrong ? 1 : 0;
}

int checkBroadcast(hcComm_t comm, hcDataType_t t, size_t count, int root, bool in_place, int salt) {
  Ctx x(comm);
  const size_t e = hcTypeSize(t);
  Buf in(count * e + 1), out(count * e + 1, 0x5a);
  for (size_t i = 0; i < count; ++i) store(in.data(), t, i, inputValue(t, hcSum, root, i, salt));
  void* recv = in_place && x.rank == root ? in.data() : out.data();
  std::string what =
      std::string("Broadcast ") + typeName(t) + " count " + std::to_string(count) + " root " + std::to_string(root);
  if (report(hcBroadcast(in.data(), recv, count, t, root, comm, nullptr), what.c_str(), x.rank)) return 1;
  Checker ck{what, x.rank};
  for (size_t i = 0; i < count; ++i) ck.check(t, i, load(recv, t, i), load(in.data(), t, i));
  return ck.wrong ? 1 : 0;
}

int checkBitwiseRefused(hcComm_t comm) {
  Ctx x(comm);
  int fails = 0;
  const struct {
    hcDataType_t t;
    const char* name;
  } floats[] = {{hcFloat16, "float16"}, {hcBfloat16, "bfloat16"}, {hcFloat32, "float32"}, {hcFloat64, "float64"}};
  const struct {
    hcRedOp_t op;
    const char* name;
  } ops[] = {{hcBand, "band"}, {hcBor, "bor"}, {hcBxor, "bxor"}};
  std::vector<double> in(5 * x.W, 1.0), out(5 * x.W);
  for (const auto& f : floats)
    for (const auto& o : ops)
      for (bool rs : {false, true}) {
        const hcResult_t r = rs ? hcReduceScatter(in.data(), out.data(), 5, f.t, o.op, comm, nullptr)
                                : hcAllReduce(in.data(), out.data(), 5, f.t, o.op, comm, nullptr);
        const std::string err = hcGetLastError(comm);
        if (r != hcInvalidArgument || err.find(o.name) == std::string::npos || err.find(f.name) == std::string::npos) {
          std::fprintf(stderr, "[rank %d] %s %s on %s returned %s (want invalid argument naming both): %s\n", x.rank,
                       rs ? "hcReduceScatter" : "hcAllReduce", o.name, f.name, hcGetErrorString(r), err.c_str());
          ++fails;
        }
      }
  return fails;
}

int checkMatrix(hcComm_t comm, const std::vector<size_t>& sizes) {
  Ctx x(comm);
  int fails = checkBitwiseRefused(comm), salt = 0;
  for (size_t count : sizes)
    for (hcDataType_t t : kAllTypes)
      for (bool ip : {false, true}) {
        fails += checkAllGather(comm, t, count, ip, ++salt);
        for (int op = 0; op <= hcNumOps; ++op) {
          if (isBitwise(op) && isFloat(t)) continue;  // refused (checkBitwiseRefused)
          fails += checkReduceScatter(comm, t, static_cast<hcRedOp_t>(op), count, ip, ++salt);
          fails += checkAllReduce(comm, t, static_cast<hcRedOp_t>(op), count, ip, ++salt);
        }
        fails += checkBroadcast(comm, t, count, (salt % x.W), ip, ++salt);
      }
  return fails;
}

}  // namespace hctest
