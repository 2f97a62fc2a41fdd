// The two roles a communicator plays in agbench: Sync coordinates the benchmark itself
// (barriers, combining times and error counts) and Variant is what gets measured. Sync never
// runs on a measured communicator, so the measured one's statistics count only measured calls.
#pragma once

#include <hicoll/hicoll.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "agbench.h"

namespace agbench {

class Sync {
 public:
  enum class Red { Sum, Min, Max };
  virtual ~Sync() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  // A barrier whose waiters sleep rather than spin, for timing one rank alone (memcpy).
  virtual void quietBarrier() { barrier(); }
  virtual void allreduce(double* v, int n, Red r) = 0;
  virtual void allreduce(int64_t* v, int n, Red r) = 0;
  virtual void allgather(const void* mine, void* all, size_t bytes) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
};

class Variant {
 public:
  virtual ~Variant() = default;
  virtual std::string name() const = 0;
  virtual bool supports(Coll c, const TypeDesc& t, int op, bool in_place) const = 0;
  // One blocking call. Buffers are laid out as nccl-tests does: in place, the input sits at
  // its in-place position inside recv.
  virtual void run(Coll c, const Geometry& g, const TypeDesc& t, int op, int root, bool in_place, char* send,
                   char* recv) = 0;
  // MPI_IN_PLACE Reduce_scatter_block leaves the result at the start of recv, not at the
  // rank's block as hicoll (and NCCL) do.
  virtual bool rsInPlaceAtStart() const { return false; }
  // The measured hicoll communicator (statistics), or null.
  virtual hcComm_t comm() const { return nullptr; }
  // Elements per scale when the variant quantizes (hcAllGatherQuantized), else 0: its output
  // is checked against the format's error bound instead of bitwise.
  virtual size_t quantBlock() const { return 0; }
};

struct HcError : std::runtime_error {
  HcError(const std::string& what, hcResult_t r) : std::runtime_error(what), result(r) {}
  hcResult_t result;
};
// Throws HcError with the library's message when r is not hcSuccess.
void hcCheck(hcResult_t r, hcComm_t comm, const char* call);

std::unique_ptr<Sync> makeHicollSync(hcComm_t comm);
// quant_block > 0: its AllGather is hcAllGatherQuantized with that block (float types only).
std::unique_ptr<Variant> makeHicollVariant(hcComm_t comm, std::string name, size_t quant_block = 0);

#ifdef AGBENCH_HAVE_MPI
void mpiInit(int* argc, char*** argv);
void mpiFinalize();
void mpiAbort(int code);
int mpiRank();
int mpiSize();
std::unique_ptr<Sync> makeMpiSync();
std::unique_ptr<Variant> makeMpiVariant();
#endif

}  // namespace agbench
