/* A C program that knows only hicoll.h: bootstrap with MPI (hcGetUniqueId on rank 0, MPI_Bcast,
 * hcCommInitRank), then exact AllGather / ReduceScatter / AllReduce checks. Run it under
 * mpirun with HICOLL_TOPO_NODE set per rank to simulate nodes (see run_mpi_example.sh). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "hicoll/hicoll.h"

#define CHECK(call)                                                                                             \
  do {                                                                                                          \
    hcResult_t r_ = (call);                                                                                     \
    if (r_ != hcSuccess) {                                                                                      \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, hcGetErrorString(r_), hcGetLastError(comm)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                             \
    }                                                                                                           \
  } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  hcComm_t comm = NULL;
  hcUniqueId id;
  if (rank == 0) CHECK(hcGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  CHECK(hcCommInitRank(&comm, nranks, id, rank));

  const size_t n = 1000003; /* odd, so blocks are not aligned */
  int* in = malloc(n * sizeof(int) * nranks);
  int* out = malloc(n * sizeof(int) * nranks);
  long wrong = 0;

  for (size_t i = 0; i < n; ++i) in[i] = rank * 1000 + (int)(i % 997);
  CHECK(hcAllGather(in, out, n, hcInt32, comm, NULL));
  for (int r = 0; r < nranks; ++r)
    for (size_t i = 0; i < n; ++i) wrong += out[r * n + i] != r * 1000 + (int)(i % 997);

  for (size_t i = 0; i < n * nranks; ++i) in[i] = rank + (int)(i % 13);
  CHECK(hcReduceScatter(in, out, n, hcInt32, hcSum, comm, NULL));
  for (size_t i = 0; i < n; ++i) wrong += out[i] != nranks * (nranks - 1) / 2 + nranks * (int)((rank * n + i) % 13);

  for (size_t i = 0; i < n; ++i) in[i] = (rank + 1) * (int)(i % 7);
  CHECK(hcAllReduce(in, out, n, hcInt32, hcSum, comm, NULL));
  for (size_t i = 0; i < n; ++i) wrong += out[i] != nranks * (nranks + 1) / 2 * (int)(i % 7);

  hcStats s = HC_STATS_INITIALIZER;
  CHECK(hcCommGetStats(comm, &s));
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  printf("rank %d: node %d local %d of %d nodes; allgather %s, inter-node bytes %llu; wrong elements %ld\n", rank,
         s.node, s.local_rank, s.nnodes,
         s.coll[hcCollAllGather].calls[hcPathHierarchical] ? "hierarchical" : "fallback",
         (unsigned long long)s.coll[hcCollAllGather].bytes_inter, wrong);
  if (rank == 0) printf("%s: %ld wrong elements in total\n", total ? "FAILED" : "PASSED", total);
  CHECK(hcCommDestroy(comm));
  free(in);
  free(out);
  MPI_Finalize();
  return total ? 1 : 0;
}
