#!/usr/bin/env bash
# One node's ranks of a torch program, as torchrun's --nnodes/--node-rank would start them,
# for perf/netns_emulate.sh -a (which appends --np --nodes --node-rank --master-addr
# --master-port to the arguments). Every other argument goes to the program:
#
#   perf/netns_emulate.sh -N 2 -L 2 -a perf/torch/node_launch.sh -- examples/fsdp2_train.py --steps 20
#
# Ranks are numbered node by node (node k holds k*L .. k*L+L-1); the python is the repository's
# .venv when there is one. Exits with the first failing rank's status.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py="$here/../../.venv/bin/python"
[[ -x $py ]] || py=python3
args=() np="" nodes="" node_rank="" addr="" port=""
while (($#)); do
  case $1 in
    --np) np=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --node-rank) node_rank=$2; shift 2 ;;
    --master-addr) addr=$2; shift 2 ;;
    --master-port) port=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ -n $np && -n $nodes && -n $node_rank && -n $addr && -n $port ]] ||
  { echo "node_launch: needs --np --nodes --node-rank --master-addr --master-port" >&2; exit 2; }
per=$((np / nodes))
pids=()
for ((l = 0; l < per; l++)); do
  RANK=$((node_rank * per + l)) LOCAL_RANK=$l LOCAL_WORLD_SIZE=$per WORLD_SIZE=$np GROUP_RANK=$node_rank \
    MASTER_ADDR=$addr MASTER_PORT=$port OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=${HICOLL_SOCKET_IFNAME:-lo} \
    "$py" "${args[@]}" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || { s=$?; ((status)) || status=$s; }; done
exit "$status"
