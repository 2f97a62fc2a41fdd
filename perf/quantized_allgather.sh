#!/usr/bin/env bash
# The quantized AllGather side by side with the exact one and Open MPI (issue: fewer bytes on
# the links): 64 MiB, fp32 and bf16, on 2x2 and 4x1 emulated nodes at 1 Gbit/s (network
# namespaces, needs root) and on one node (1x2, no slow link). Results go to OUT (default
# perf/results, relative to the repository), one .txt and one .json per run.
#
#   perf/quantized_allgather.sh [-a agbench] [-o OUT] [-r REPS]
set -euo pipefail
cd "$(dirname "$0")/.."  # relative paths: the results record their command line
agbench=build/perf/agbench
out=perf/results
reps=3
while getopts "a:o:r:" o; do
  case $o in
    a) agbench=$OPTARG ;;
    o) out=$OPTARG ;;
    r) reps=$OPTARG ;;
    *) sed -n 2,8p "$0"; exit 2 ;;
  esac
done
mkdir -p "$out"
common=(allgather -b 64M -e 64M -c 1 --quant 256 -v)
for dt in float bfloat16; do
  for layout in "2 2" "4 1"; do
    set -- $layout
    name="quantized_allgather_${1}x${2}_${dt}"
    echo "== $name" >&2
    perf/netns_emulate.sh -N "$1" -L "$2" -m mpi -a "$agbench" -- "${common[@]}" -n 5 -w 2 --reps "$reps" -d "$dt" \
      -J "$out/$name.json" | tee "$out/$name.txt"
  done
  # One node: quantized by force (by default HICOLL_QUANT_MIN_NODES=2 makes it exact there).
  name="quantized_allgather_1x2_${dt}"
  echo "== $name" >&2
  HICOLL_QUANT_MIN_NODES=1 "$agbench" "${common[@]}" -n 20 -w 5 --reps "$((reps + 2))" -d "$dt" --np 2 \
    --baseline mpi,memcpy -J "$out/$name.json" | tee "$out/$name.txt"
done
