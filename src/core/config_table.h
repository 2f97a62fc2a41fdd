// Every environment knob of hicoll, declared once. env.md is generated from this table
// (`hicoll_info --markdown`) and a test checks that they agree.
//
// X(id, NAME, type, default, allowed, doc)
//   type: String | Int | Size | Size8K (size, a positive multiple of 8192) | Bool | Enum | List
//   allowed: for Enum and List, the accepted words separated by '|'
#pragma once

#define HICOLL_KNOBS(X)                                                                          \
  X(Debug, "HICOLL_DEBUG", Enum, "WARN", "NONE|WARN|INFO|TRACE",                                 \
    "Log level. INFO announces every fallback with its reason; TRACE logs every collective.")   \
  X(TimeoutMs, "HICOLL_TIMEOUT_MS", Int, "120000", "",                                           \
    "Upper bound in milliseconds on every wait (bootstrap, peers, network). A dead or silent "   \
    "peer becomes hcTimeout or hcRemoteError after at most this long.")                          \
  X(TopoNode, "HICOLL_TOPO_NODE", String, "", "",                                                \
    "Node label of this rank. Ranks with the same label form one node. Default: the host "     \
    "name. Lets tests simulate several nodes on one machine.")                                  \
  X(Algo, "HICOLL_ALGO", Enum, "auto", "auto|hier|ring",                                         \
    "Algorithm for host buffers: hier (hierarchical), ring (flat ring), or auto (hier when "    \
    "the configuration supports it).")                                                           \
  X(ForceFallback, "HICOLL_FORCE_FALLBACK", List, "",                                            \
    "allgather|reducescatter|allreduce|broadcast|all",                                           \
    "Collectives forced onto the fallback path (NCCL for device buffers, flat ring for host "   \
    "buffers), comma separated. The seed's ddp_dist_backend=nccl.")                              \
  X(ScratchBytes, "SMDDP_AG_SCRATCH_BUFFER_SIZE_BYTES", Size8K, "16777216", "",                  \
    "Scratch buffer per rank (registered). The hierarchical AllGather (and AllReduce) fall "   \
    "back when it is smaller than the per-rank block; ReduceScatter stages chunks through it.")                                               \
  X(SortBytes, "SMDDP_AG_SORT_BUFFER_SIZE_BYTES", Size8K, "134217728", "",                       \
    "Sort buffer per rank (registered, readable by the ranks of the node). The hierarchical "   \
    "AllGather, ReduceScatter and AllReduce fall back when it is smaller than nodes x per-rank block.")        \
  X(ChunkBytes, "HICOLL_CHUNK_SIZE", Size, "1048576", "",                                        \
    "Pipeline chunk: the inter-node exchange of chunk k+1 overlaps the intra-node sort of "     \
    "chunk k.")                                                                                  \
  X(NetChunkBytes, "HICOLL_NET_CHUNK_SIZE", Size, "262144", "",                                 \
    "Largest inter-node message of the hierarchical algorithms: on more than one node their "  \
    "chunk is the smaller of this and HICOLL_CHUNK_SIZE (emulated 1 Gbit/s links: 256 KiB "     \
    "chunks kept them fuller than 1 MiB, perf/README.md).")                                    \
  X(NetWindow, "HICOLL_NET_WINDOW", Int, "4", "",                                                 \
    "Hierarchical AllGather and ReduceScatter: chunks sent to a rail peer beyond those fully "  \
    "received from the rail peers (at least 1). A few in flight, not all, keep the links' "      \
    "queues short (perf/README.md).")                                                          \
  X(DeviceChunkBytes, "HICOLL_DEVICE_CHUNK_SIZE", Size, "67108864", "",                          \
    "Pipeline chunk of the device-buffer path. Large: each chunk costs a cross-process stream "  \
    "handshake (measured on an H200: 1 MiB chunks gave 5.7 GB/s AllGather busbw, 64 MiB 159 "   \
    "GB/s). Inter-node chunks are further capped by the scratch and sort buffers.")            \
  X(AllReduceSmallBytes, "HICOLL_ALLREDUCE_SMALL_BYTES", Size, "65536", "",                      \
    "AllReduce buffers up to this size use the latency-optimal path (one AllGather, local "    \
    "reduction).")                                                                               \
  X(ShmCma, "HICOLL_SHM_CMA", Enum, "auto", "auto|0|1",                                          \
    "Intra-node single copy with process_vm_readv from the peer's buffer. auto: use it when "   \
    "the kernel allows; 0: stage through shared memory (two copies).")                           \
  X(ShmEagerBytes, "HICOLL_SHM_EAGER_BYTES", Size, "4096", "",                                  \
    "AllGather blocks up to this size are copied into the sender's shared segment and read "   \
    "from there with memcpy, instead of one process_vm_readv system call per peer (1x2, 8 B: "   \
    "1.37 -> 0.75 us; the crossover was near 4 KiB per block).")          \
  X(OfiProvider, "HICOLL_OFI_PROVIDER", String, "tcp;ofi_rxm", "",                               \
    "libfabric provider for inter-node traffic (FI_PROVIDER, when set, takes precedence). "     \
    "EFA in production; tcp;ofi_rxm or net on ordinary Linux.")                                  \
  X(OfiIface, "HICOLL_OFI_IFACE", String, "", "",                                                \
    "Network interface for libfabric endpoints. Default: lo when all ranks share one host, "    \
    "else the provider's choice.")                                                               \
  X(OfiRxmEager, "HICOLL_OFI_RXM_EAGER", Enum, "1", "0|1",                                        \
    "With ofi_rxm: 1 sets FI_OFI_RXM_EAGER_LIMIT (unless set) to HICOLL_NET_CHUNK_SIZE, so each "  \
    "chunk is one eager message (rxm over tcp places it in the receive buffer) instead of "        \
    "rendezvous (2x2 netns 64 MiB ReduceScatter 330 -> 283 ms). Applies when this process "       \
    "initializes libfabric.")                                                                    \
  X(SocketIfname, "HICOLL_SOCKET_IFNAME", String, "", "",                                        \
    "Interface the hcGetUniqueId rendezvous listener binds to. Default: loopback.")             \
  X(CommId, "HICOLL_COMM_ID", String, "", "",                                                    \
    "host:port of the rendezvous for hcCommInitFromEnv when MASTER_ADDR/MASTER_PORT are not "  \
    "set (rank 0 listens there).")                                                               \
  X(CommSecret, "HICOLL_COMM_SECRET", String, "", "",                                            \
    "Shared secret of a hcCommInitFromEnv job (every rank the same). Without it the secret is "  \
    "derived from the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, Open MPI's jobid).") \
  X(RendezvousFd, "HICOLL_RENDEZVOUS_FD", Int, "-1", "",                                        \
    "For rank 0 of hcCommInitFromEnv: a listening socket inherited from the launcher, used "    \
    "instead of binding HICOLL_COMM_ID's port (no other process can take the port between the " \
    "launcher choosing it and rank 0 listening). The self-launcher sets it.")                  \
  X(NcclLib, "HICOLL_NCCL_LIB", String, "libnccl.so.2", "",                                      \
    "Library loaded with dlopen for the NCCL fallback of device buffers.")
