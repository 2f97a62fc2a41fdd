// Every environment knob of hicoll, declared once. env.md is generated from this table
// (`hicoll_info --markdown`) and a test checks that they agree.
//
// X(id, NAME, type, default, allowed, min, max, agree, doc)
//   type: String | Int | Size | Size8K (size, a positive multiple of 8192) | Bool | Enum | List
//   allowed: for Enum and List, the accepted words separated by '|'
//   min, max: the accepted range of Int and Size knobs (inclusive; ignored for other types)
//   agree: Agree when every rank must have the same value (checked at communicator creation,
//          before any transport is set up: a difference would make ranks take different paths
//          or speak different protocols), Local when ranks may differ
#pragma once

#include <cstdint>

#define HICOLL_KNOB_INT_MAX INT64_C(2147483647)
#define HICOLL_KNOB_GIB (INT64_C(1) << 30)

#define HICOLL_KNOBS(X)                                                                                              \
  X(Debug, "HICOLL_DEBUG", Enum, "WARN", "NONE|WARN|INFO|TRACE", 0, 0, Local,                                        \
    "Log level. INFO announces every fallback with its reason; TRACE logs every collective.")                        \
  X(TimeoutMs, "HICOLL_TIMEOUT_MS", Int, "120000", "", 1, HICOLL_KNOB_INT_MAX, Local,                                \
    "Upper bound in milliseconds on every wait (bootstrap, peers, network). A dead or silent "                       \
    "peer becomes hcTimeout or hcRemoteError after at most this long.")                                              \
  X(TopoNode, "HICOLL_TOPO_NODE", String, "", "", 0, 0, Local,                                                       \
    "Node label of this rank. Ranks with the same label form one node. Default: the host "                           \
    "name. Lets tests simulate several nodes on one machine.")                                                       \
  X(Algo, "HICOLL_ALGO", Enum, "auto", "auto|hier|ring", 0, 0, Agree,                                                \
    "Algorithm for host buffers: hier (hierarchical whenever the configuration supports it, "                        \
    "fixed rules), ring (flat ring), or auto: the path, the AllReduce latency-path split and "                       \
    "the network chunk and window with the lowest time the cost model predicts "                                     \
    "(HICOLL_MODEL_FILE).")                                                                                          \
  X(ModelFile, "HICOLL_MODEL_FILE", String, "", "", 0, 0, Agree,                                                     \
    "Machine figures of the cost model (JSON, written by agbench --calibrate). Empty: defaults "                     \
    "for HICOLL_OFI_PROVIDER. Every rank must read the same contents.")                                              \
  X(ForceFallback, "HICOLL_FORCE_FALLBACK", List, "", "allgather|reducescatter|allreduce|broadcast|alltoall|all", 0, \
    0, Agree,                                                                                                        \
    "Collectives forced onto the fallback path (NCCL for device buffers, flat ring for host "                        \
    "buffers), comma separated. The seed's ddp_dist_backend=nccl. AllToAll has one (flat) "                          \
    "path: the library counts it as a fallback, the torch plugin hands it to gloo / NCCL.")                          \
  X(ScratchBytes, "SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", Size8K, "16777216", "", 8192, (INT64_C(1) << 40), Agree,     \
    "Scratch buffer per rank (registered). A hierarchical AllGather (and AllReduce) block larger "                   \
    "than it streams through it in pieces, one phase each; ReduceScatter stages chunks through it.")                 \
  X(SortBytes, "SMDDP_AG_SORT_BUFFER_SIZE_BYTES", Size8K, "134217728", "", 8192, (INT64_C(1) << 40), Agree,          \
    "Sort buffer per rank (registered, readable by the ranks of the node). Across nodes a "                          \
    "hierarchical AllGather, ReduceScatter or AllReduce block of more than this / nodes bytes "                      \
    "streams through it in pieces.")                                                                                 \
  X(ScratchStrict, "HICOLL_SCRATCH_STRICT", Bool, "0", "", 0, 0, Agree,                                              \
    "1: the seed's rule instead of pieces: a block larger than the scratch buffer, or nodes x "                      \
    "block larger than the sort buffer, takes the fallback (the device path always does).")                          \
  X(ChunkBytes, "HICOLL_CHUNK_SIZE", Size, "1048576", "", 4096, HICOLL_KNOB_GIB, Agree,                              \
    "Pipeline chunk: the inter-node exchange of chunk k+1 overlaps the intra-node sort of "                          \
    "chunk k.")                                                                                                      \
  X(NetChunkBytes, "HICOLL_NET_CHUNK_SIZE", Size, "262144", "", 4096, HICOLL_KNOB_GIB, Agree,                        \
    "Inter-node message of the chunked algorithms: on more than one node their chunk is the "                        \
    "smaller of this and HICOLL_CHUNK_SIZE (how the default was chosen: perf/results/2026-11-30.md). Left "          \
    "unset under HICOLL_ALGO=auto, the cost model may raise it, up to HICOLL_CHUNK_SIZE, where "                     \
    "it predicts fewer messages faster.")                                                                            \
  X(NetWindow, "HICOLL_NET_WINDOW", Int, "4", "", 1, 1024, Local,                                                    \
    "Hierarchical AllGather and ReduceScatter: chunks sent to a rail peer beyond those fully "                       \
    "received from the rail peers. A few in flight, not all, keep the links' queues short "                          \
    "(perf/results/2026-11-30.md).")                                                                                 \
  X(NetProbeBytes, "HICOLL_NET_PROBE_BYTES", Size, "1048576", "", 0, HICOLL_KNOB_GIB, Agree,                         \
    "Without HICOLL_MODEL_FILE: bytes each rank sends its rail peer in the first round of the "                      \
    "link measurement at the communicator's first call across nodes (the cost model's built-in "                     \
    "link is a guess; HICOLL_ALGO=auto decides by it). Rounds grow (up to 16x, within the "                          \
    "scratch buffer) until one lasts 10 ms. A later communicator over the same nodes (and "                          \
    "ranks per node) takes the figures its ranks' processes measured. 0: no measurement.")                           \
  X(ModelRefineCalls, "HICOLL_MODEL_REFINE_CALLS", Int, "16", "", 0, 1 << 20, Agree,                                 \
    "Without HICOLL_MODEL_FILE, on more than one node: the cost model refines its latency, "                         \
    "link and CPU figures per band of call sizes (4x wide) from the modelled calls it timed, "                       \
    "agreed by every rank, after this many of them and again after 4, 16 and 64 times as many "                      \
    "(then calls are no longer timed). Each step is within 4x, all of them within 16x; a band "                      \
    "no call was timed in takes the latencies of the nearest smaller band's and the link and "                       \
    "CPU of the nearest larger's. 0: off (perf/results/2026-12-05-bands.md).")                                       \
  X(Reproducible, "HICOLL_REPRODUCIBLE", Bool, "1", "", 0, 0, Agree,                                                 \
    "1: what decides how a reduction sums (a ReduceScatter's or AllReduce's path, the "                              \
    "AllReduce split, whether a quantized call quantizes) is the model as no timing moved "                          \
    "it: HICOLL_MODEL_FILE or the built-in figures, never the link measured at the first "                           \
    "call nor the refinement (HICOLL_MODEL_REFINE_CALLS), so a job sums alike on every run "                         \
    "and after a resume. Those timings still set the chunk, the window, the AllGather's path "                       \
    "and the predictions. 0: they decide the reductions too (a sum's rounding may then "                             \
    "differ between runs).")                                                                                         \
  X(DeviceChunkBytes, "HICOLL_DEVICE_CHUNK_SIZE", Size, "67108864", "", 4096, 4 * HICOLL_KNOB_GIB, Agree,            \
    "Pipeline chunk of the device-buffer path. Large: each chunk costs a cross-process stream "                      \
    "handshake (tests/gpu/results). Inter-node chunks are further capped by the scratch and "                        \
    "sort buffers.")                                                                                                 \
  X(AllReduceSmallBytes, "HICOLL_ALLREDUCE_SMALL_BYTES", Size, "65536", "", 0, HICOLL_KNOB_GIB, Agree,               \
    "AllReduce buffers up to this size use the latency-optimal path (one AllGather, local "                          \
    "reduction).")                                                                                                   \
  X(ShmCma, "HICOLL_SHM_CMA", Enum, "auto", "auto|0|1", 0, 0, Agree,                                                 \
    "Intra-node single copy with process_vm_readv from the peer's buffer. auto: use it when "                        \
    "the kernel allows it without widening ptrace access; 0: stage through shared memory (two "                      \
    "copies).")                                                                                                      \
  X(ShmEagerBytes, "HICOLL_SHM_EAGER_BYTES", Size, "4096", "", 0, (INT64_C(16) << 20), Agree,                        \
    "AllGather, ReduceScatter and AllToAll blocks up to this size are copied into the sender's shared segment and "  \
    "read from there with memcpy, instead of one process_vm_readv system call per peer.")                            \
  X(BcastRootWaits, "HICOLL_BCAST_ROOT_WAITS", Bool, "0", "", 0, 0, Agree,                                           \
    "0: a Broadcast on one node small enough to be staged (up to 2 x HICOLL_SHM_EAGER_BYTES, 16 x "                  \
    "where the host's ranks outnumber its cores) returns on its root once the data is staged, "                      \
    "as an MPI root's eager send, and up to 256 "                                                                    \
    "bytes its other ranks wait for the root only; a rank that disagrees with the call, or "                         \
    "never starts it, fails it at once on the ranks that wait for it and on the others at "                          \
    "one of their next 255 calls (the first that is not such a Broadcast), naming the "                              \
    "Broadcast (hcCommDestroy, which waits for nobody, checks what was posted). 1: every rank "                      \
    "waits for every other to start the call, so the call itself fails everywhere.")                                 \
  X(StreamCopyBytes, "HICOLL_STREAM_COPY_BYTES", Size, "25165824", "", 0, (INT64_C(1) << 40), Local,                 \
    "A host call that writes at least this many bytes of output on a rank copies into it with "                      \
    "non-temporal stores (past the caches; a copy of buffers the caches cannot hold no longer "                      \
    "reads the destination first). 0: always; set it above the largest call: never.")                                \
  X(MemCacheBytes, "HICOLL_MEM_CACHE_BYTES", Size, "1073741824", "", 0, (INT64_C(1) << 40), Local,                   \
    "hcMemAlloc (and the torch plugin's allocate_tensor): freed node memory kept for reuse up "                      \
    "to this many bytes per process, so a training step's buffers are not created and mapped "                       \
    "anew every time (read at the first allocation); also the most of its local peers' node "                        \
    "memory a rank keeps mapped between calls (their released allocations are unmapped).")                           \
  X(QuantMinNodes, "HICOLL_QUANT_MIN_NODES", Int, "2", "", 0, HICOLL_KNOB_INT_MAX, Agree,                            \
    "hcAllGatherQuantized and hcReduceScatterQuantized quantize on communicators of at least "                       \
    "this many nodes and run the exact collective on fewer (within a node memory, not a link, "                      \
    "bounds the call, and quantizing costs more than it saves: see perf/results/2026-12-01.md). 1: "                 \
    "quantize everywhere. 0: the cost model decides per call (quantize where it predicts the "                       \
    "quantized call faster than the exact one; uniform nodes, else as 2).")                                          \
  X(OfiProvider, "HICOLL_OFI_PROVIDER", String, "tcp;ofi_rxm", "", 0, 0, Agree,                                      \
    "libfabric provider for inter-node traffic (FI_PROVIDER, when set, takes precedence). "                          \
    "EFA in production; tcp;ofi_rxm or net on ordinary Linux. net (libfabric 1.17) is lighter, but a "               \
    "message of more than 128 bytes that no receive has been posted for holds back its "                             \
    "sender's later ones, so point-to-point messages across nodes received in another order than "                   \
    "sent wait for the timeout (perf/results/2026-12-06-rxm.md).")                                                   \
  X(OfiIface, "HICOLL_OFI_IFACE", String, "", "", 0, 0, Local,                                                       \
    "Network interface for libfabric endpoints. Default: lo when all ranks share one host, "                         \
    "else the provider's choice.")                                                                                   \
  X(OfiRxmEager, "HICOLL_OFI_RXM_EAGER", Enum, "1", "0|1", 0, 0, Agree,                                              \
    "With ofi_rxm: 1 sets FI_OFI_RXM_EAGER_LIMIT (unless set) to the largest net chunk "                             \
    "(HICOLL_NET_CHUNK_SIZE, or HICOLL_CHUNK_SIZE where the model may raise it), so each "                           \
    "chunk is one eager message (rxm over tcp places it in the receive buffer) instead of "                          \
    "rendezvous, which left links idle (perf/results/2026-11-30.md). Set when libhicoll loads, from the "            \
    "environment (hcConfig_t does not change it), and read by libfabric when this process first initializes it; "    \
    "the limit must be the same on every rank (creation fails naming it otherwise).")                                \
  X(OfiRxmLean, "HICOLL_OFI_RXM_LEAN", Enum, "1", "0|1", 0, 0, Agree,                                                \
    "With ofi_rxm: 1 sets FI_OFI_RXM_MSG_RX_SIZE=1024 and FI_OFI_RXM_BUFFER_SIZE=8192 (each unless "                 \
    "set). rxm's own defaults over tcp post 4096 receive buffers of 16 KiB in every endpoint (one "                  \
    "per process with HICOLL_OFI_SHARED_ENDPOINT=1, else one per communicator that spans nodes; "                    \
    "resident memory: perf/results/2026-12-06-rxm.md). The receive buffers bound how many messages "                 \
    "that no receive has been posted for yet rxm holds per endpoint; beyond them the rest wait in the "              \
    "sockets. Set when libhicoll loads, like HICOLL_OFI_RXM_EAGER.")                                                 \
  X(OfiSharedEndpoint, "HICOLL_OFI_SHARED_ENDPOINT", Bool, "1", "", 0, 0, Local,                                     \
    "1: the communicators of a process that span nodes share one libfabric endpoint (per "                           \
    "provider and interface), each numbered in the tag bits above hicoll's own, instead of each "                    \
    "opening its own: an endpoint's buffers and connections cost tens of MB with tcp;ofi_rxm "                       \
    "(perf/results/2026-12-06-shared-endpoint.md). Where any rank of a communicator has 0, or the "                  \
    "ranks have no number free on all, its ranks open their own. 0 on one rank is enough.")                          \
  X(SocketIfname, "HICOLL_SOCKET_IFNAME", String, "", "", 0, 0, Local,                                               \
    "Interface the hcGetUniqueId rendezvous listener binds to. Default: loopback.")                                  \
  X(CommId, "HICOLL_COMM_ID", String, "", "", 0, 0, Local,                                                           \
    "host:port of the rendezvous for hcCommInitFromEnv when MASTER_ADDR/MASTER_PORT are not "                        \
    "set (rank 0 listens there).")                                                                                   \
  X(CommSecret, "HICOLL_COMM_SECRET", String, "", "", 0, 0, Local,                                                   \
    "Shared secret of a hcCommInitFromEnv job (every rank the same; at least 16 characters of "                      \
    "randomness, e.g. `openssl rand -hex 16`). Without it the secret is derived from the "                           \
    "launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, Open MPI's jobid), which a local "                        \
    "process may guess: hicoll then warns, and binds the rendezvous to loopback when every "                         \
    "rank is on one host.")                                                                                          \
  X(RendezvousFd, "HICOLL_RENDEZVOUS_FD", Int, "-1", "", -1, HICOLL_KNOB_INT_MAX, Local,                             \
    "For rank 0 of hcCommInitFromEnv: a listening socket inherited from the launcher, used "                         \
    "instead of binding HICOLL_COMM_ID's port (no other process can take the port between the "                      \
    "launcher choosing it and rank 0 listening). The self-launcher sets it.")                                        \
  X(NcclLib, "HICOLL_NCCL_LIB", String, "libnccl.so.2", "", 0, 0, Local,                                             \
    "Library loaded with dlopen for the NCCL fallback of device buffers.")
