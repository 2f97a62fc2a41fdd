// Tables (types, ops), nccl-tests geometry and bandwidth formulas, the memcpy baseline.
#include <algorithm>
#include <vector>

#include "agbench.h"

namespace agbench {

const char* collName(Coll c) {
  switch (c) {
    case Coll::AllGather: return "allgather";
    case Coll::ReduceScatter: return "reducescatter";
    case Coll::AllReduce: return "allreduce";
    case Coll::Broadcast: return "broadcast";
    case Coll::AllToAll: return "alltoall";
    case Coll::SendRecv: return "sendrecv";
  }
  return "?";
}

bool collReduces(Coll c) {
  return c == Coll::ReduceScatter || c == Coll::AllReduce;
}

hcColl_t statsIndex(Coll c) {
  switch (c) {
    case Coll::AllGather: return hcCollAllGather;
    case Coll::ReduceScatter: return hcCollReduceScatter;
    case Coll::AllReduce: return hcCollAllReduce;
    case Coll::Broadcast: return hcCollBroadcast;
    case Coll::AllToAll: return hcCollAllToAll;
    case Coll::SendRecv: return hcNumColls;
  }
  return hcCollAllGather;
}

int sendRecvPeer(int rank, int nranks) {
  return (rank + nranks / 2) % nranks;
}

int legsPerCall(Coll c) {
  return c == Coll::SendRecv ? 2 : 1;
}

const std::vector<TypeDesc>& allTypes() {
  // exact: the largest integer that is exact in the type (fp16 11 bits, bf16 8 bits of
  // significand) and in range; the data check keeps every value and every result below it.
  // uint8 stops at 200 so that the poison byte 0xCD (205) is never a correct result.
  static const std::vector<TypeDesc> t = {
      {hcInt8, "int8", 1, 127},
      {hcUint8, "uint8", 1, 200},
      {hcInt32, "int32", 4, (int64_t{1} << 31) - 1},
      {hcUint32, "uint32", 4, (int64_t{1} << 32) - 1},
      {hcInt64, "int64", 8, int64_t{1} << 53},
      {hcUint64, "uint64", 8, int64_t{1} << 53},
      {hcFloat16, "half", 2, 2048},
      {hcFloat32, "float", 4, int64_t{1} << 24},
      {hcFloat64, "double", 8, int64_t{1} << 53},
      {hcBfloat16, "bfloat16", 2, 256},
  };
  return t;
}

const char* opName(int op) {
  switch (op) {
    case kOpNone: return "none";
    case hcSum: return "sum";
    case hcProd: return "prod";
    case hcMax: return "max";
    case hcMin: return "min";
    case hcAvg: return "avg";
    case kOpMulSum: return "mulsum";
  }
  return "?";
}

const std::vector<int>& allOps() {
  static const std::vector<int> ops = {hcSum, hcProd, hcMax, hcMin, hcAvg, kOpMulSum};
  return ops;
}

bool Args::has(Baseline b) const {
  return std::find(baselines.begin(), baselines.end(), b) != baselines.end();
}

std::vector<size_t> Args::sizes() const {
  std::vector<size_t> out;
  for (size_t s = min_bytes; s <= max_bytes;) {
    out.push_back(s);
    size_t next = step_factor > 1 ? s * static_cast<size_t>(step_factor) : s + step_bytes;
    if (next <= s) break;  // -f 1 -i 0, or a zero start with a factor
    s = next;
  }
  return out;
}

uint64_t Args::hash() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  };
  mix(static_cast<uint64_t>(coll));
  mix(min_bytes), mix(max_bytes), mix(step_bytes), mix(step_factor);
  mix(iters), mix(warmup), mix(check), mix(root), mix(average), mix(blocking), mix(reps);
  for (const TypeDesc& t : types) mix(t.dt);
  for (int op : ops) mix(static_cast<uint64_t>(op + 1000));
  for (Baseline b : baselines) mix(static_cast<uint64_t>(b) + 77);
  for (char c : algo) mix(static_cast<unsigned char>(c));
  mix(verbose);
  mix(calibrate);
  mix(iters_bytes);
  mix(node_memory);
  mix(quant_block);
  mix(per_iter), mix(per_iter_skip);
  mix(agg_iters), mix(run_cycles), mix(unalign), mix(report_cputime), mix(report_timestamps), mix(memory_report);
  return h;
}

Geometry geometry(Coll c, size_t bytes, size_t ts, int n) {
  Geometry g;
  const size_t count = bytes / ts;
  const size_t un = static_cast<size_t>(n);
  switch (c) {
    case Coll::AllToAll:  // as nccl-tests: size is each rank's buffer, count what goes to one peer
      g.count = count / un;
      g.send_count = g.recv_count = g.count * un;
      g.size_bytes = g.send_count * ts;
      break;
    case Coll::AllGather:
      g.send_count = count / un;
      g.recv_count = g.send_count * un;
      g.count = g.send_count;
      g.size_bytes = g.recv_count * ts;
      break;
    case Coll::ReduceScatter:
      g.recv_count = count / un;
      g.send_count = g.recv_count * un;
      g.count = g.recv_count;
      g.size_bytes = g.send_count * ts;
      break;
    case Coll::AllReduce:
    case Coll::Broadcast:
    case Coll::SendRecv:  // one message of size bytes each way
      g.send_count = g.recv_count = g.count = count;
      g.size_bytes = count * ts;
      break;
  }
  return g;
}

void bandwidth(Coll c, const Geometry& g, size_t ts, int n, double sec, double* algbw, double* busbw) {
  if (sec <= 0) {
    *algbw = *busbw = 0;
    return;
  }
  const double nn = n;
  double base = 0, factor = 1;
  switch (c) {
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AllToAll:
      base = static_cast<double>(g.count) * ts * nn / sec / 1e9;
      factor = (nn - 1) / nn;
      break;
    case Coll::AllReduce:
      base = static_cast<double>(g.count) * ts / sec / 1e9;
      factor = 2 * (nn - 1) / nn;
      break;
    case Coll::Broadcast:
    case Coll::SendRecv:  // sec is one way (half a round trip)
      base = static_cast<double>(g.count) * ts / sec / 1e9;
      factor = 1;
      break;
  }
  *algbw = base;
  *busbw = base * factor;
}

}  // namespace agbench
