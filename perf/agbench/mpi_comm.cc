// Open MPI: the bootstrap under mpirun (Sync) and the side-by-side baseline (Variant).
// C bindings only.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <unistd.h>

#include <climits>
#include <string>

#include "comm.h"

namespace agbench {
namespace {

void mpiCheck(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(call) + " failed: " + msg);
}

MPI_Op mpiOp(Sync::Red r) {
  return r == Sync::Red::Sum ? MPI_SUM : r == Sync::Red::Min ? MPI_MIN : MPI_MAX;
}

class MpiSync final : public Sync {
 public:
  int rank() const override { return mpiRank(); }
  int size() const override { return mpiSize(); }
  void barrier() override { mpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  // Open MPI's blocking calls spin; a spinning waiter on the other core (or hyperthread) halves
  // rank 0's memcpy here, so waiters poll MPI_Test with naps.
  void quietBarrier() override {
    MPI_Request req;
    mpiCheck(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");
    int done = 0;
    while (true) {
      mpiCheck(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) break;
      usleep(50);
    }
  }
  void allreduce(double* v, int n, Red r) override {
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, mpiOp(r), MPI_COMM_WORLD), "MPI_Allreduce");
  }
  void allreduce(int64_t* v, int n, Red r) override {
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, mpiOp(r), MPI_COMM_WORLD), "MPI_Allreduce");
  }
  void allgather(const void* mine, void* all, size_t bytes) override {
    mpiCheck(
        MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD),
        "MPI_Allgather");
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    mpiCheck(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
};

// The datatype MPI moves or reduces; MPI has no fp16/bf16 arithmetic, but gathering and
// broadcasting them is plain 16-bit data.
MPI_Datatype mpiType(hcDataType_t dt, bool reduce) {
  switch (dt) {
    case hcInt8: return MPI_INT8_T;
    case hcUint8: return MPI_UINT8_T;
    case hcInt32: return MPI_INT32_T;
    case hcUint32: return MPI_UINT32_T;
    case hcInt64: return MPI_INT64_T;
    case hcUint64: return MPI_UINT64_T;
    case hcFloat32: return MPI_FLOAT;
    case hcFloat64: return MPI_DOUBLE;
    case hcFloat16:
    case hcBfloat16: return reduce ? MPI_DATATYPE_NULL : MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpiRedOp(int op) {
  switch (op) {
    case hcSum: return MPI_SUM;
    case hcProd: return MPI_PROD;
    case hcMax: return MPI_MAX;
    case hcMin: return MPI_MIN;
    default: return MPI_OP_NULL;  // avg and pre-multiplied sums have no MPI op
  }
}

class MpiVariant final : public Variant {
 public:
  std::string name() const override { return "mpi"; }
  bool rsInPlaceAtStart() const override { return true; }

  bool supports(Coll c, const TypeDesc& t, int op, bool in_place) const override {
    if (mpiType(t.dt, collReduces(c)) == MPI_DATATYPE_NULL) return false;
    if (collReduces(c) && mpiRedOp(op) == MPI_OP_NULL) return false;
    if (c == Coll::Broadcast && !in_place) return false;  // MPI_Bcast has one buffer
    // As hicoll's: out of place only.
    if ((c == Coll::AllToAll || c == Coll::SendRecv) && in_place) return false;
    return true;
  }

  void run(Coll c, const Geometry& g, const TypeDesc& t, int op, int root, bool in_place, char* send,
           char* recv) override {
    MPI_Datatype ty = mpiType(t.dt, collReduces(c));
    if (g.count > static_cast<size_t>(INT_MAX)) throw std::runtime_error("MPI: count > INT_MAX");
    const int n = static_cast<int>(g.count);
    switch (c) {
      case Coll::AllGather:
        if (in_place)
          mpiCheck(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, ty, MPI_COMM_WORLD), "MPI_Allgather");
        else mpiCheck(MPI_Allgather(send, n, ty, recv, n, ty, MPI_COMM_WORLD), "MPI_Allgather");
        break;
      case Coll::ReduceScatter:
        mpiCheck(MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : send, recv, n, ty, mpiRedOp(op), MPI_COMM_WORLD),
                 "MPI_Reduce_scatter_block");
        break;
      case Coll::AllReduce:
        mpiCheck(MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, n, ty, mpiRedOp(op), MPI_COMM_WORLD),
                 "MPI_Allreduce");
        break;
      case Coll::Broadcast: mpiCheck(MPI_Bcast(recv, n, ty, root, MPI_COMM_WORLD), "MPI_Bcast"); break;
      case Coll::AllToAll: mpiCheck(MPI_Alltoall(send, n, ty, recv, n, ty, MPI_COMM_WORLD), "MPI_Alltoall"); break;
      case Coll::SendRecv: {  // the same round trip as hicoll's
        const int me = mpiRank(), peer = sendRecvPeer(me, mpiSize());
        if (me < peer) {
          mpiCheck(MPI_Send(send, n, ty, peer, 0, MPI_COMM_WORLD), "MPI_Send");
          mpiCheck(MPI_Recv(recv, n, ty, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
        } else {
          mpiCheck(MPI_Recv(recv, n, ty, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
          mpiCheck(MPI_Send(send, n, ty, peer, 0, MPI_COMM_WORLD), "MPI_Send");
        }
        break;
      }
    }
  }
};

}  // namespace

void mpiInit(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_SINGLE, &provided);
  // Errors come back as codes and become exceptions with the rank's message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void mpiFinalize() {
  MPI_Finalize();
}
void mpiAbort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
}

int mpiRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int mpiSize() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

std::unique_ptr<Sync> makeMpiSync() {
  return std::make_unique<MpiSync>();
}
std::unique_ptr<Variant> makeMpiVariant() {
  return std::make_unique<MpiVariant>();
}

}  // namespace agbench
