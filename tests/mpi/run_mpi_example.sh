#!/bin/bash
# mpirun -np 4 with two simulated nodes: contiguous (0,1 | 2,3) or interleaved (0,2 | 1,3).
# usage: run_mpi_example.sh BINARY contiguous|interleaved [VAR=VALUE ...]
set -euo pipefail
bin=$1 layout=$2
shift 2
envs=()
for kv in "$@"; do envs+=(-x "$kv"); done
node='node$((OMPI_COMM_WORLD_RANK / 2))'
[ "$layout" = interleaved ] && node='node$((OMPI_COMM_WORLD_RANK % 2))'
# Loopback only: shared-memory MPI transport, runtime traffic on lo.
exec timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl self,vader \
  --mca oob_tcp_if_include lo "${envs[@]}" \
  sh -c "HICOLL_TOPO_NODE=$node exec $bin"
