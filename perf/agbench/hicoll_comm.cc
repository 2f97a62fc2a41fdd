// Sync and Variant over hicoll communicators.
#include <cstring>
#include <map>
#include <string>

#include "comm.h"

namespace agbench {

void hcCheck(hcResult_t r, hcComm_t comm, const char* call) {
  if (r == hcSuccess) return;
  std::string msg = std::string(call) + " failed: " + hcGetErrorString(r);
  const char* last = hcGetLastError(comm);
  if (last && *last) msg += std::string(" (") + last + ")";
  throw HcError(msg, r);
}

namespace {

class HicollSync final : public Sync {
 public:
  explicit HicollSync(hcComm_t comm) : comm_(comm) {
    hcCheck(hcCommUserRank(comm, &rank_), comm, "hcCommUserRank");
    hcCheck(hcCommCount(comm, &size_), comm, "hcCommCount");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { hcCheck(hcBarrier(comm_), comm_, "hcBarrier"); }
  void allreduce(double* v, int n, Red r) override {
    hcCheck(hcAllReduce(v, v, n, hcFloat64, op(r), comm_, nullptr), comm_, "hcAllReduce");
  }
  void allreduce(int64_t* v, int n, Red r) override {
    hcCheck(hcAllReduce(v, v, n, hcInt64, op(r), comm_, nullptr), comm_, "hcAllReduce");
  }
  void allgather(const void* mine, void* all, size_t bytes) override {
    hcCheck(hcAllGather(mine, all, bytes, hcUint8, comm_, nullptr), comm_, "hcAllGather");
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    hcCheck(hcBroadcast(buf, buf, bytes, hcUint8, root, comm_, nullptr), comm_, "hcBroadcast");
  }

 private:
  static hcRedOp_t op(Red r) { return r == Red::Sum ? hcSum : r == Red::Min ? hcMin : hcMax; }
  hcComm_t comm_;
  int rank_ = 0, size_ = 1;
};

class HicollVariant final : public Variant {
 public:
  HicollVariant(hcComm_t comm, std::string name, size_t quant_block)
      : comm_(comm), name_(std::move(name)), quant_block_(quant_block) {
    hcCheck(hcCommUserRank(comm, &rank_), comm, "hcCommUserRank");
    hcCheck(hcCommCount(comm, &size_), comm, "hcCommCount");
  }
  ~HicollVariant() override {
    for (auto& [dt, op] : premul_) hcRedOpDestroy(op, comm_);
  }
  std::string name() const override { return name_; }
  bool supports(Coll c, const TypeDesc& t, int op, bool in_place) const override {
    if (c == Coll::AllToAll || c == Coll::SendRecv) return !in_place && !quant_block_;  // not in place
    const bool fp = t.dt == hcFloat32 || t.dt == hcBfloat16 || t.dt == hcFloat16;
    return !quant_block_ ||
           (fp && (c == Coll::AllGather || (c == Coll::ReduceScatter && (op == hcSum || op == hcAvg))));
  }
  hcComm_t comm() const override { return comm_; }
  size_t quantBlock() const override { return quant_block_; }

  void run(Coll c, const Geometry& g, const TypeDesc& t, int op, int root, bool in_place, char* send,
           char* recv) override {
    const size_t ts = t.size;
    hcResult_t r = hcSuccess;
    switch (c) {
      case Coll::AllGather: {
        const char* s = in_place ? recv + static_cast<size_t>(rank_) * g.count * ts : send;
        if (quant_block_) {
          hcQuant q = HC_QUANT_INITIALIZER;
          q.block = quant_block_;
          r = hcAllGatherQuantized(s, recv, g.count, t.dt, &q, comm_, nullptr);
        } else {
          r = hcAllGather(s, recv, g.count, t.dt, comm_, nullptr);
        }
        break;
      }
      case Coll::ReduceScatter: {
        const char* s = in_place ? recv : send;
        char* d = in_place ? recv + static_cast<size_t>(rank_) * g.count * ts : recv;
        if (quant_block_) {
          hcQuant q = HC_QUANT_INITIALIZER;
          q.block = quant_block_;
          r = hcReduceScatterQuantized(s, d, g.count, t.dt, redop(op, t), &q, comm_, nullptr);
        } else {
          r = hcReduceScatter(s, d, g.count, t.dt, redop(op, t), comm_, nullptr);
        }
        break;
      }
      case Coll::AllReduce:
        r = hcAllReduce(in_place ? recv : send, recv, g.count, t.dt, redop(op, t), comm_, nullptr);
        break;
      case Coll::Broadcast: r = hcBroadcast(in_place ? recv : send, recv, g.count, t.dt, root, comm_, nullptr); break;
      case Coll::AllToAll: r = hcAllToAll(send, recv, g.count, t.dt, comm_, nullptr); break;
      case Coll::SendRecv: {  // one round trip: the lower rank of the pair sends first
        const int peer = sendRecvPeer(rank_, size_);
        if (rank_ < peer) {
          r = hcSend(send, g.count, t.dt, peer, comm_, nullptr);
          if (r == hcSuccess) r = hcRecv(recv, g.count, t.dt, peer, comm_, nullptr);
        } else {
          r = hcRecv(recv, g.count, t.dt, peer, comm_, nullptr);
          if (r == hcSuccess) r = hcSend(send, g.count, t.dt, peer, comm_, nullptr);
        }
        break;
      }
    }
    hcCheck(r, comm_, collName(c));
  }

 private:
  // The pre-multiplied sum (scalar 2) is created once per datatype, outside the timing.
  hcRedOp_t redop(int op, const TypeDesc& t) {
    if (op != kOpMulSum) return static_cast<hcRedOp_t>(op);
    auto it = premul_.find(t.dt);
    if (it != premul_.end()) return it->second;
    alignas(8) unsigned char scalar[8] = {};
    switch (t.dt) {
      case hcInt8:
      case hcUint8: scalar[0] = 2; break;
      case hcInt32:
      case hcUint32: {
        int32_t v = 2;
        std::memcpy(scalar, &v, 4);
        break;
      }
      case hcInt64:
      case hcUint64: {
        int64_t v = 2;
        std::memcpy(scalar, &v, 8);
        break;
      }
      case hcFloat16: {
        uint16_t v = 0x4000;
        std::memcpy(scalar, &v, 2);
        break;
      }
      case hcBfloat16: {
        uint16_t v = 0x4000;
        std::memcpy(scalar, &v, 2);
        break;
      }
      case hcFloat32: {
        float v = 2;
        std::memcpy(scalar, &v, 4);
        break;
      }
      case hcFloat64: {
        double v = 2;
        std::memcpy(scalar, &v, 8);
        break;
      }
      default: break;
    }
    hcRedOp_t created{};
    hcCheck(hcRedOpCreatePreMulSum(&created, scalar, t.dt, comm_), comm_, "hcRedOpCreatePreMulSum");
    premul_[t.dt] = created;
    return created;
  }

  hcComm_t comm_;
  std::string name_;
  size_t quant_block_ = 0;
  int rank_ = 0, size_ = 1;
  std::map<hcDataType_t, hcRedOp_t> premul_;
};

}  // namespace

std::unique_ptr<Sync> makeHicollSync(hcComm_t comm) {
  return std::make_unique<HicollSync>(comm);
}

std::unique_ptr<Variant> makeHicollVariant(hcComm_t comm, std::string name, size_t quant_block) {
  return std::make_unique<HicollVariant>(comm, std::move(name), quant_block);
}

}  // namespace agbench
