/*
 * hicoll: hierarchical AllGather / ReduceScatter for sharded data-parallel training.
 *
 * The C ABI, modelled on nccl.h. Every call returns an hcResult_t; no C++ exception ever
 * crosses this boundary. hcGetLastError() returns a human-readable description of the last
 * failure on the calling thread (it names the rank, peer, collective and size).
 *
 * Buffers and streams
 *   stream == NULL  : host buffers; the call blocks until the operation is complete on this
 *                     rank (its receive buffer holds the result, its send buffer may be reused).
 *   stream != NULL  : a cudaStream_t; buffers are device memory. The call enqueues the work and
 *                     returns; it starts after prior work on the stream and later work waits
 *                     for it (only in builds with CUDA; otherwise hcUnsupported). The legacy
 *                     default stream, whose handle is 0, is passed as cudaStreamLegacy.
 *
 * Ordering
 *   Collectives on one communicator must be called in the same order on every rank, from one
 *   thread at a time. Different communicators are independent. A call entered on a
 *   communicator while another thread is inside one (a collective, hcCommSplit, hcCommShrink)
 *   returns hcInvalidUsage at once naming both, and revokes the communicator: the call in
 *   progress and the peers' calls fail too (or complete with the right data), never silently
 *   wrong. hcCommDestroy meanwhile waits for the call to return (bounded by HICOLL_TIMEOUT_MS);
 *   hcCommAbort makes it return promptly, then frees. hcCommGetStats, hcCommGetConfig,
 *   hcCommCount, hcCommUserRank and hcCommRevoke may be called from any thread.
 *
 * Counts
 *   Counts are in elements of the given datatype. A zero count is valid and completes
 *   immediately on every rank without communication (all ranks must pass zero).
 *   Counts, datatypes and ops must agree across ranks; a mismatch that is detected returns
 *   hcInvalidUsage (or hcRemoteError on the peer) instead of corrupting memory.
 *
 * In-place rules (as in NCCL)
 *   AllGather:     in place when sendbuff == recvbuff + rank * sendcount * size(datatype).
 *   ReduceScatter: in place when recvbuff == sendbuff + rank * recvcount * size(datatype).
 *   AllReduce, Broadcast: in place when sendbuff == recvbuff.
 *   Any other overlap of send and receive buffers is invalid (hcInvalidArgument).
 *
 * Errors
 *   After hcRemoteError or hcTimeout the communicator is unusable: call hcCommAbort or
 *   hcCommDestroy. Every wait is bounded by HICOLL_TIMEOUT_MS.
 */
#ifndef HICOLL_HICOLL_H_
#define HICOLL_HICOLL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HICOLL_MAJOR 0
#define HICOLL_MINOR 2
#define HICOLL_PATCH 0
#define HICOLL_VERSION_CODE (HICOLL_MAJOR * 10000 + HICOLL_MINOR * 100 + HICOLL_PATCH)

#if defined(__GNUC__)
#define HC_API __attribute__((visibility("default")))
#else
#define HC_API
#endif

typedef struct hcComm* hcComm_t;
/* A cudaStream_t for device buffers, NULL for host buffers. */
typedef void* hcStream_t;

#define HC_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[HC_UNIQUE_ID_BYTES];
} hcUniqueId;

typedef enum {
  hcSuccess = 0,
  hcInvalidArgument = 1, /* a bad pointer, count, datatype, op or rank */
  hcInvalidUsage = 2,    /* a call sequence or configuration the library does not allow */
  hcSystemError = 3,     /* an OS or library call failed */
  hcRemoteError = 4,     /* a peer failed, died or disagreed */
  hcTimeout = 5,         /* a wait exceeded HICOLL_TIMEOUT_MS */
  hcUnsupported = 6,     /* valid, but not supported by this build or configuration */
  hcInternalError = 7,
  hcInProgress = 8,
  hcNumResults = 9
} hcResult_t;

typedef enum {
  hcInt8 = 0,
  hcUint8 = 1,
  hcInt32 = 2,
  hcUint32 = 3,
  hcInt64 = 4,
  hcUint64 = 5,
  hcFloat16 = 6,
  hcFloat32 = 7,
  hcFloat64 = 8,
  hcBfloat16 = 9,
  hcNumTypes = 10,
  hcMaxDataType = 0x7fffffff, /* so that any value a caller passes is one the type can hold */
  /* aliases, as in nccl.h */
  hcChar = hcInt8,
  hcInt = hcInt32,
  hcHalf = hcFloat16,
  hcFloat = hcFloat32,
  hcDouble = hcFloat64
} hcDataType_t;

/* Built-in reductions. fp16 and bf16 are reduced in fp32 arithmetic. hcAvg divides the sum by
 * the number of ranks (integer division, truncating, for integer types). hcBand, hcBor and
 * hcBxor (bitwise and, or, xor) are for the integer types only (uint8 0/1 serves as bool:
 * and, or, parity); on fp16/bf16/fp32/fp64 the call fails with hcInvalidArgument naming the op
 * and the datatype on every rank (NCCL has no bitwise ops: device calls that would run on the
 * NCCL fallback fail with hcUnsupported). A pre-multiplied sum is made with
 * hcRedOpCreatePreMulSum and has a value >= hcNumOps. */
typedef enum {
  hcSum = 0,
  hcProd = 1,
  hcMax = 2,
  hcMin = 3,
  hcAvg = 4,
  hcBand = 5,
  hcBor = 6,
  hcBxor = 7,
  hcNumOps = 8,
  hcMaxRedOp = 0x7fffffff
} hcRedOp_t;

/* Paths a collective can take; indexes of hcCollStats.calls. hcPathRing is the flat path: the
 * ring, and AllToAll's pairwise exchange (its only path). */
typedef enum { hcPathHierarchical = 0, hcPathRing = 1, hcPathFallback = 2, hcNumPaths = 3 } hcPath_t;

typedef enum {
  hcCollAllGather = 0,
  hcCollReduceScatter = 1,
  hcCollAllReduce = 2,
  hcCollBroadcast = 3,
  hcCollBarrier = 4,
  hcCollAllToAll = 5, /* hcAllToAll and hcAllToAllv */
  hcNumColls = 6
} hcColl_t;

typedef struct {
  uint64_t calls[hcNumPaths]; /* calls by path taken */
  uint64_t bytes_intra;       /* payload bytes moved between this rank and its node's ranks
                                 (sent, or read by this rank from their buffers) */
  uint64_t bytes_inter;       /* payload bytes this rank sent to ranks on other nodes */
  char last_fallback_reason[128];
} hcCollStats;

/* Grows at the end only; set .size = sizeof(hcStats) before calling hcCommGetStats. A caller
 * built when hcNumColls was 5 (before hcCollAllToAll) passes its smaller size and gets its own
 * layout back. */
typedef struct {
  size_t size;
  int rank, nranks;
  int nnodes, local_ranks; /* local_ranks = 0 when nodes have uneven rank counts */
  int node, local_rank;
  hcCollStats coll[hcNumColls];
  /* Of bytes_intra, what this rank read from local peers' node memory (hcMemAlloc) with plain
   * loads, per collective: nonzero when the zero-copy path ran. */
  uint64_t bytes_node_memory[hcNumColls];
  /* Quantized calls (hcAllGatherQuantized, hcReduceScatterQuantized) per collective, counted
   * when quantization ran; they are also counted in coll[],
   * whose bytes are then the quantized bytes actually moved. */
  uint64_t quantized_calls[hcNumColls];
  /* The cost model's prediction for the last host AllGather / ReduceScatter / AllReduce, in
   * microseconds, on the path it took (0: not modelled). HICOLL_ALGO=auto chooses by it. */
  double predicted_us[hcNumColls];
  /* The pipeline chunk (bytes) and the chunks in flight per rail peer of the last host
   * AllGather / ReduceScatter / AllReduce (0: none yet): across nodes the inter-node chunk
   * (under HICOLL_ALGO=auto the model's), on one node HICOLL_CHUNK_SIZE. */
  uint64_t chunk_bytes[hcNumColls];
  uint64_t net_window[hcNumColls];
  /* Point-to-point (hcSend ... hcIrecvAnyTag): operations this rank completed and their
   * payload bytes (sends to itself counted as a send and a receive); of the receives, the
   * messages copied aside because they arrived before a receive with their tag. */
  uint64_t p2p_sends, p2p_recvs;
  uint64_t p2p_bytes_sent, p2p_bytes_received;
  uint64_t p2p_copied_aside;
  /* The cost model's figures in use: its link (bytes per second each way per node) and where
   * the figures come from ("built-in defaults (tcp;ofi_rxm)", HICOLL_MODEL_FILE's path, and
   * "; link ... measured at the first call" when HICOLL_NET_PROBE_BYTES measured it). */
  double model_net_Bps;
  char model_source[192];
} hcStats;
#define HC_STATS_INITIALIZER \
  { sizeof(hcStats) }

/* An injectable bootstrap: a key-value store shared by all ranks (for example a c10d Store).
 * get() blocks until the key exists or timeout_ms passes; values have the exact length asked.
 * del() (optional: NULL, or absent when size is that of the first version) deletes a key no
 * rank will read again, so the store does not keep growing. Callbacks return 0 on success,
 * non-zero on failure. The store must outlive the communicator and every communicator split
 * from it. */
typedef struct {
  size_t size; /* sizeof(hcStoreOps) */
  void* ctx;
  int (*set)(void* ctx, const char* key, const void* value, size_t len);
  int (*get)(void* ctx, const char* key, void* value, size_t len, int timeout_ms);
  int (*del)(void* ctx, const char* key);
} hcStoreOps;

/* Per-communicator configuration (as NCCL's ncclConfig_t): a field left as
 * HC_CONFIG_INITIALIZER sets it takes the value of its environment variable (env.md); a field
 * set overrides the variable for this communicator only. Values are checked exactly as the
 * variables are (same ranges; those marked "same on every rank" compared across ranks at
 * creation). A communicator made by hcCommSplit / hcCommShrink inherits its parent's effective
 * configuration, with the overrides of hcCommSplitConfig's config on top. Grows at the end. */
#define HC_CONFIG_UNDEF_INT (-9223372036854775807LL - 1)
typedef struct {
  size_t size;                   /* sizeof(hcConfig_t) */
  unsigned int magic;            /* HC_CONFIG_MAGIC */
  unsigned int version;          /* HICOLL_VERSION_CODE */
  const char* name;              /* shown in this communicator's log lines (not a variable) */
  const char* algo;              /* HICOLL_ALGO: "auto", "hier" or "ring" */
  const char* forceFallback;     /* HICOLL_FORCE_FALLBACK: "allgather,reducescatter", "all", "" */
  const char* debug;             /* HICOLL_DEBUG for this communicator's log lines */
  const char* topoNode;          /* HICOLL_TOPO_NODE: this rank's node label */
  long long timeoutMs;           /* HICOLL_TIMEOUT_MS */
  long long chunkBytes;          /* HICOLL_CHUNK_SIZE */
  long long netChunkBytes;       /* HICOLL_NET_CHUNK_SIZE */
  long long netWindow;           /* HICOLL_NET_WINDOW */
  long long deviceChunkBytes;    /* HICOLL_DEVICE_CHUNK_SIZE */
  long long allreduceSmallBytes; /* HICOLL_ALLREDUCE_SMALL_BYTES */
  long long scratchBytes;        /* SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES */
  long long sortBytes;           /* SMDDP_AG_SORT_BUFFER_SIZE_BYTES */
  long long quantMinNodes;       /* HICOLL_QUANT_MIN_NODES */
} hcConfig_t;
#define HC_CONFIG_MAGIC 0x68636667u /* "hcfg" */
#define HC_CONFIG_INITIALIZER                                                                                    \
  {                                                                                                              \
    sizeof(hcConfig_t), HC_CONFIG_MAGIC, HICOLL_VERSION_CODE, NULL, NULL, NULL, NULL, NULL, HC_CONFIG_UNDEF_INT, \
        HC_CONFIG_UNDEF_INT, HC_CONFIG_UNDEF_INT, HC_CONFIG_UNDEF_INT, HC_CONFIG_UNDEF_INT, HC_CONFIG_UNDEF_INT, \
        HC_CONFIG_UNDEF_INT, HC_CONFIG_UNDEF_INT, HC_CONFIG_UNDEF_INT                                            \
  }

HC_API const char* hcGetErrorString(hcResult_t result);
/* The last error message of the calling thread ("" when none). */
HC_API const char* hcGetLastError(hcComm_t comm);
HC_API hcResult_t hcGetVersion(int* version);

/* Rank 0 calls this once and passes the id to all ranks out of band (MPI_Bcast, a file...).
 * It starts a rendezvous listener on HICOLL_SOCKET_IFNAME (default loopback) that lives in
 * this process until the communicator created with it is destroyed. */
HC_API hcResult_t hcGetUniqueId(hcUniqueId* uniqueId);
HC_API hcResult_t hcCommInitRank(hcComm_t* comm, int nranks, hcUniqueId commId, int rank);
HC_API hcResult_t hcCommInitRankConfig(hcComm_t* comm, int nranks, hcUniqueId commId, int rank,
                                       const hcConfig_t* config);
/* Reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun), OMPI_COMM_WORLD_* (mpirun) or
 * SLURM_PROCID/SLURM_NTASKS (srun); the rendezvous is MASTER_ADDR:MASTER_PORT or
 * HICOLL_COMM_ID=host:port, with rank 0 listening there. */
HC_API hcResult_t hcCommInitFromEnv(hcComm_t* comm);
HC_API hcResult_t hcCommInitFromEnvConfig(hcComm_t* comm, const hcConfig_t* config);
/* Bootstraps through a caller-provided key-value store; keys are prefixed with prefix. Every
 * communicator needs a prefix no earlier one used on that store: the keys are never deleted,
 * so a reused prefix reads the previous communicator's values. */
HC_API hcResult_t hcCommInitRankStore(hcComm_t* comm, int nranks, int rank, const hcStoreOps* store,
                                      const char* prefix);
HC_API hcResult_t hcCommInitRankStoreConfig(hcComm_t* comm, int nranks, int rank, const hcStoreOps* store,
                                            const char* prefix, const hcConfig_t* config);
/* Collective over comm. Ranks with the same color form a new communicator ordered by key
 * (then by parent rank). color < 0 (HC_SPLIT_NOCOLOR) returns *newcomm = NULL. */
#define HC_SPLIT_NOCOLOR (-1)
HC_API hcResult_t hcCommSplit(hcComm_t comm, int color, int key, hcComm_t* newcomm);
HC_API hcResult_t hcCommSplitConfig(hcComm_t comm, int color, int key, hcComm_t* newcomm, const hcConfig_t* config);
/* The configuration comm runs with, every field filled in (strings stay valid while comm lives).
 * Set config->size (HC_CONFIG_INITIALIZER does) before the call. */
HC_API hcResult_t hcCommGetConfig(const hcComm_t comm, hcConfig_t* config);
/* After a failure, the survivors continue without the ranks in excludeRanks (NCCL's
 * ncclCommShrink): called by every rank that is not excluded, never by the excluded ones (they
 * may be dead), it makes *newcomm of the survivors in old-rank order, bootstrapped through the
 * store of comm (with hcCommInitRank / hcCommInitFromEnv that store lives in rank 0's process,
 * so rank 0 must survive; a store injected with hcCommInitRankStore, such as torchrun's, has no
 * such limit). Every survivor must pass the same set. Bounded by HICOLL_TIMEOUT_MS. comm stays
 * valid (failed or not) and is destroyed or aborted by the caller afterwards. flags:
 * HC_SHRINK_ABORT first aborts comm (peers stop waiting on this rank). */
#define HICOLL_HAS_COMM_SHRINK 1
#define HC_SHRINK_DEFAULT 0
#define HC_SHRINK_ABORT 1
HC_API hcResult_t hcCommShrink(hcComm_t comm, const int* excludeRanks, int excludeCount, hcComm_t* newcomm, int flags);
/* Frees the communicator; safe after an error. With ranks on other nodes it first meets them
 * (bounded by HICOLL_TIMEOUT_MS) so that messages in flight are delivered. */
HC_API hcResult_t hcCommDestroy(hcComm_t comm);
/* Marks the communicator failed so peers stop waiting on it, then frees it. */
HC_API hcResult_t hcCommAbort(hcComm_t comm);
/* Marks the communicator failed and tells its peers, without freeing it: safe while another
 * thread is inside a call on comm, which then returns hcRemoteError promptly (so do the peers'
 * calls on it). Later calls fail at once; destroy or abort it afterwards. For recovery: a
 * process that gives up on a communicator revokes it, so that nobody waits for it in vain. */
HC_API hcResult_t hcCommRevoke(hcComm_t comm);
HC_API hcResult_t hcCommCount(const hcComm_t comm, int* count);
HC_API hcResult_t hcCommUserRank(const hcComm_t comm, int* rank);
HC_API hcResult_t hcCommGetStats(const hcComm_t comm, hcStats* stats);

/* op = scalar * sum(x): each input is multiplied by *scalar (host memory, of datatype) first. */
HC_API hcResult_t hcRedOpCreatePreMulSum(hcRedOp_t* op, const void* scalar, hcDataType_t datatype, hcComm_t comm);
HC_API hcResult_t hcRedOpDestroy(hcRedOp_t op, hcComm_t comm);

/* recvbuff holds nranks * sendcount elements in rank order. */
HC_API hcResult_t hcAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, hcDataType_t datatype,
                              hcComm_t comm, hcStream_t stream);
/* Block quantization for the quantized collectives (DeepSpeed ZeRO++'s qwZ format): int8,
 * symmetric, one fp32 scale (the block's absmax) per block of `block` elements. An element x of
 * a block of absmax a arrives as round(x * 127 / a) * a / 127, so it is off by at most a / 254
 * (plus the output type's rounding); NaN and +-Inf arrive as NaN. */
#define HICOLL_HAS_QUANTIZED 1
typedef enum { hcQuantInt8Absmax = 0 } hcQuantFormat_t;
typedef struct {
  size_t size;            /* sizeof(hcQuant) */
  hcQuantFormat_t format; /* hcQuantInt8Absmax */
  size_t block;           /* elements per scale; 0 = 256; at most 2^24 */
} hcQuant;
#define HC_QUANT_INITIALIZER \
  { sizeof(hcQuant), hcQuantInt8Absmax, 256 }

/* An AllGather that moves each rank's block as int8 codes and scales, on every level (within
 * the node too), and dequantizes every block into recvbuff, this rank's own included: every
 * rank holds bit-identical output (the dequantized values, not sendbuff's). datatype: fp32,
 * bf16 or fp16. sendbuff is not modified; in place as hcAllGather. Every rank must pass the
 * same count, datatype and block. Communicators of fewer than HICOLL_QUANT_MIN_NODES nodes
 * (default 2) run it exactly; with HICOLL_QUANT_MIN_NODES=0 it quantizes where the cost model
 * predicts that faster than the exact call (hcStats.quantized_calls counts the quantized
 * ones; predicted_us holds the model's time of the whole call). Device buffers (with a
 * stream) quantize on the device path from HICOLL_QUANT_MIN_NODES nodes on (from 2 under 0:
 * the model has no device figures), with the same bits as the host; where that path cannot
 * run, NCCL's exact AllGather (announced as a fallback). */
HC_API hcResult_t hcAllGatherQuantized(const void* sendbuff, void* recvbuff, size_t sendcount, hcDataType_t datatype,
                                       const hcQuant* quant, hcComm_t comm, hcStream_t stream);

/* A ReduceScatter whose partial sums cross nodes as int8 codes and scales (the gradients'
 * direction): within a node the sums stay exact (peers' inputs are read where they lie); each
 * node's partial of a block is quantized once, sent to the block's owner, and dequantized
 * there and summed in fp32 with the owner's node partial, rounded once to datatype. The result
 * is off by at most the sum over the other nodes of absmax(their partial's block) / 254, plus
 * the rounding of datatype. op: hcSum, hcAvg or a pre-multiplied sum; datatype fp32, bf16 or
 * fp16. The flat ring (HICOLL_ALGO=ring, fallbacks) runs it exactly, and so does a
 * communicator that would not quantize an hcAllGatherQuantized (HICOLL_QUANT_MIN_NODES, the
 * cost model under 0) (hcStats.quantized_calls counts the quantized ones). Device buffers (with
 * a stream) quantize on the device path from HICOLL_QUANT_MIN_NODES nodes on (from 2 under 0),
 * each chunk's partials on their own (so the blocks restart at chunk boundaries), with the same
 * bound; where that path cannot run, NCCL's exact ReduceScatter (announced as a fallback). */
HC_API hcResult_t hcReduceScatterQuantized(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           hcDataType_t datatype, hcRedOp_t op, const hcQuant* quant, hcComm_t comm,
                                           hcStream_t stream);

/* sendbuff holds nranks * recvcount elements; rank r receives the reduction of block r. */
HC_API hcResult_t hcReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, hcDataType_t datatype,
                                  hcRedOp_t op, hcComm_t comm, hcStream_t stream);
HC_API hcResult_t hcAllReduce(const void* sendbuff, void* recvbuff, size_t count, hcDataType_t datatype, hcRedOp_t op,
                              hcComm_t comm, hcStream_t stream);
/* sendbuff is read on root only; recvbuff receives count elements on every rank.
 * On one node, a Broadcast small enough to be staged (HICOLL_SHM_EAGER_BYTES x 8) returns on
 * its root once the data is staged (sendbuff may be reused), and up to 256 bytes the other
 * ranks wait for the root only: a run of them flows like MPI's eager sends. A rank that
 * disagrees with such a call (or never makes it) fails it at once on the ranks that wait for
 * it, and on the others at one of their next 255 calls, naming the Broadcast; hcCommDestroy
 * (which waits for nobody) fails for a disagreement already posted or a peer that destroyed
 * its communicator without the call. HICOLL_BCAST_ROOT_WAITS=1: every rank waits for every
 * other, as for the other collectives. */
HC_API hcResult_t hcBroadcast(const void* sendbuff, void* recvbuff, size_t count, hcDataType_t datatype, int root,
                              hcComm_t comm, hcStream_t stream);
HC_API hcResult_t hcBarrier(hcComm_t comm);

/* AllToAll (MPI_Alltoallv's arguments, in elements of datatype): this rank sends
 * sendcounts[p] elements from sendbuff + sdispls[p] to rank p and receives recvcounts[p]
 * elements from rank p into recvbuff + rdispls[p]. sdispls / rdispls NULL: the blocks lie
 * packed in rank order. recvcounts[p] here must equal sendcounts[this rank] on rank p: a pair
 * that differs fails the call on both ranks, naming both; the other ranks fail it with
 * hcRemoteError, or, if they had every block before they learnt of it, return with right data
 * and fail their next call.
 * Every rank calls it (counts of zero included). Not in place: the buffers must not overlap.
 * Blocks to ranks of this node are read where they lie (single-copy reads, or node memory),
 * blocks to other nodes go straight over the network. Host buffers only (stream NULL). */
#define HICOLL_HAS_ALLTOALL 1
HC_API hcResult_t hcAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                              const size_t* recvcounts, const size_t* rdispls, hcDataType_t datatype, hcComm_t comm,
                              hcStream_t stream);
/* Equal blocks: count elements to and from every rank, in rank order (sendbuff and recvbuff
 * hold nranks * count elements). */
HC_API hcResult_t hcAllToAll(const void* sendbuff, void* recvbuff, size_t count, hcDataType_t datatype, hcComm_t comm,
                             hcStream_t stream);

/* Point-to-point (as ncclSend / ncclRecv, with MPI's requests). count elements of datatype go
 * from one rank to one peer; peer may be the calling rank itself (the data is copied; a send to
 * self completes at once). What follows is for host buffers (stream NULL).
 *   Device buffers go with a stream, in hcSend / hcRecv and their tag-0 forms: the call enqueues
 * ncclSend / ncclRecv on the stream through the NCCL fallback and returns, as NCCL's does (the
 * device path has no point-to-point of its own yet). NCCL's rules apply there: no tags, no
 * receive from any source, sizes not compared between the pair, a send to itself only in a
 * group with its receive; hcGroupStart / hcGroupEnd make an NCCL group. The first call with a
 * stream on a communicator creates its device path and NCCL communicator collectively: every
 * rank must make one (a collective or a point-to-point call with a stream). The non-blocking
 * calls take host buffers only (hcUnsupported for device memory). hcCommGetStats counts device
 * operations when they are enqueued.
 *   Matching: the messages a rank sends a peer match that peer's receives from it in the order
 *   each side posted them. Sender and receiver must pass the same size in bytes: a size that
 *   differs fails the call on both ranks (hcInvalidUsage, naming the peer and both sizes; over
 *   shared memory the sender sees hcRemoteError with the receiver's message). Within a node,
 *   point-to-point and collectives share each pair's queue: a pair must post them in the same
 *   order on both ranks (a message of the other kind is an error naming both), as in NCCL.
 *   Errors: as for collectives. A dead or failed peer fails the wait promptly, every wait is
 *   bounded by HICOLL_TIMEOUT_MS, and a failed point-to-point call (a size that differs, a
 *   timeout, a dead peer) leaves the communicator failed. Bad arguments (a peer outside
 *   [0, nranks), a NULL buffer with a nonzero count) are hcInvalidArgument and post nothing.
 *   The network: on a communicator that spans nodes the first call that needs the network
 *   opens it, collectively: a collective, or a point-to-point call with a rank of another node
 *   (or from any source). Every rank must make one such call before a later one can complete;
 *   calling hcBarrier after creation is the simple way.
 *   Progress: operations move while this rank is inside a point-to-point call (hcTest, hcWait,
 *   the blocking calls, hcGroupEnd) and, within a node, inside a collective.
 *   Threads: the calls below take the communicator like any call (one thread at a time,
 *   "Ordering" above); hcTest and hcWait refused that way return hcInvalidUsage without
 *   revoking the communicator, and the request stays valid. */
#define HICOLL_HAS_P2P 1
typedef struct hcRequest* hcRequest_t;

/* Blocking: returns once sendbuff may be reused (the receiver has taken or acknowledged the
 * message) or recvbuff holds the data. Between hcGroupStart and hcGroupEnd they only post, and
 * hcGroupEnd completes them. With a stream (device buffers): enqueued, see above. */
HC_API hcResult_t hcSend(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm,
                         hcStream_t stream);
HC_API hcResult_t hcRecv(void* recvbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm,
                         hcStream_t stream);
/* Non-blocking: post and return a request; the buffer must stay untouched (send) or unread
 * (receive) until the request completes. hcIrecvAny receives the next message from any rank
 * (itself included) that no receive naming its sender waits for: a message goes to the earliest
 * receive posted for its source, and only then to one from any source. */
HC_API hcResult_t hcIsend(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm,
                          hcRequest_t* request);
HC_API hcResult_t hcIrecv(void* recvbuff, size_t count, hcDataType_t datatype, int peer, hcComm_t comm,
                          hcRequest_t* request);
HC_API hcResult_t hcIrecvAny(void* recvbuff, size_t count, hcDataType_t datatype, hcComm_t comm, hcRequest_t* request);
/* Tagged forms (as MPI): tag >= 0 (a negative one is hcInvalidArgument); the calls above are
 * tag 0. A receive takes the oldest pending message from its peer (from any rank:
 * hcIrecvAnyTag) with its tag; messages with different tags may be received out of order
 * relative to each other. Sizes must agree as above (the error names the tag too). A message
 * that arrives while no receive takes it, ahead of one a receive from that peer waits for, is
 * copied aside (up to 64 MiB per communicator; beyond that it waits at the sender until its
 * receive is posted, and within a node so do the messages behind it) and its send completes:
 * a size that differs is then seen by the receiver only, and fails the sender's later calls
 * through the receiver's failure. Within a node, the receives a rank posts before a collective
 * must take every p2p message its peer sent before that collective (in any order of tags). */
#define HICOLL_HAS_P2P_TAG 1
HC_API hcResult_t hcSendTag(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, int tag, hcComm_t comm,
                            hcStream_t stream);
HC_API hcResult_t hcRecvTag(void* recvbuff, size_t count, hcDataType_t datatype, int peer, int tag, hcComm_t comm,
                            hcStream_t stream);
HC_API hcResult_t hcIsendTag(const void* sendbuff, size_t count, hcDataType_t datatype, int peer, int tag,
                             hcComm_t comm, hcRequest_t* request);
HC_API hcResult_t hcIrecvTag(void* recvbuff, size_t count, hcDataType_t datatype, int peer, int tag, hcComm_t comm,
                             hcRequest_t* request);
HC_API hcResult_t hcIrecvAnyTag(void* recvbuff, size_t count, hcDataType_t datatype, int tag, hcComm_t comm,
                                hcRequest_t* request);
/* *done = 1 once the request is complete (it stays valid: hcWait frees it); makes progress. An
 * error of the operation is returned by hcTest and again by hcWait. */
HC_API hcResult_t hcTest(hcRequest_t request, int* done);
/* Waits for completion (bounded by HICOLL_TIMEOUT_MS from the call) and frees the request,
 * whatever the result (except a refused entry, see Threads above). */
HC_API hcResult_t hcWait(hcRequest_t request);
/* The rank the request's message came from (for hcIrecvAny), or the peer it names; hcInProgress
 * while a receive from any source has not been matched yet. */
HC_API hcResult_t hcRequestSource(hcRequest_t request, int* source);
/* Groups (as ncclGroupStart / ncclGroupEnd), per thread, nestable: hcSend and hcRecv inside
 * only post, so a batch to many peers in any order cannot deadlock; the outermost hcGroupEnd
 * waits for all of them (on every communicator used, bounded by the smallest timeout) and
 * returns the first error. Non-blocking calls inside a group are not waited for by it;
 * collectives inside a group run at once, as outside one. Device-buffer calls inside a group
 * form one NCCL group, which the outermost hcGroupEnd ends (enqueued, not waited for). */
HC_API hcResult_t hcGroupStart(void);
HC_API hcResult_t hcGroupEnd(void);

/* Node memory (modelled on ncclMemAlloc): host memory the ranks of a node can map. A collective
 * whose buffers live here moves each byte within the node once, with plain loads and stores
 * (no process_vm_readv, no staging through the shared segment, no CMA permission needed when
 * every rank's buffer is node memory). Local calls, independent of communicators: any
 * communicator uses it, and it may outlive them. Contents are undefined, as malloc's (freed
 * memory is kept for reuse up to HICOLL_MEM_CACHE_BYTES). hcMemFree(NULL) does nothing; a
 * pointer hcMemAlloc did not return is hcInvalidArgument.
 * Its pages are reserved by hcMemAlloc: more than the machine (or the container's memory limit)
 * can give is hcSystemError naming the sizes, never a signal at the first touch. It is anonymous
 * shared memory (memfd), not a file in /dev/shm: a small /dev/shm does not bound it, and nothing
 * is left behind when a process is killed. One file descriptor per live allocation. */
HC_API hcResult_t hcMemAlloc(void** ptr, size_t size);
HC_API hcResult_t hcMemFree(void* ptr);

/* Size of one element of datatype in bytes (0 for an invalid datatype). */
HC_API size_t hcTypeSize(hcDataType_t datatype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HICOLL_HICOLL_H_ */
