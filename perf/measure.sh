#!/usr/bin/env bash
# hicoll against Open MPI, its ring and a 1-core memcpy (perf/README.md, "The comparisons"), and
# the plotted sweeps. Each run writes perf/results/<name>.txt (the command and agbench's table) and
# .json; the plots go to perf/img/, the tables to perf/results/vs_baselines.md. Run as root from a
# build in build/ (AGBENCH=path for another agbench):
#
#   perf/measure.sh [allgather_1x2|reducescatter_1x2|emulated_2x2|small_allgather|sweeps_1x2|sweeps_2x2|plots|all]...
#   RESULTS=dir perf/measure.sh allgather_1x2     # e.g. a repeated run into another directory
#
# The machine is shared: every figure the comparisons use is a median of 5 repetitions with the
# compared variants interleaved in the same run (agbench --reps), so ratios hold even when
# absolute numbers move with the load.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=${AGBENCH:-$here/../build/perf/agbench}
PY=${PYTHON:-$here/../.venv/bin/python}
R=${RESULTS:-$here/results}
I=$here/img
mkdir -p "$R" "$I"
NS="$here/netns_emulate.sh -a $B"

run() {  # name, command... (agbench arguments last, -J appended)
  local name=$1
  shift
  local cmd=("$@" -J "$R/$name.json")
  { printf '$'; printf ' %s' "${cmd[@]}"; echo; } | sed "s#$here/\.\./##g; s#$here/#perf/#g" >"$R/$name.txt"
  echo "== $name" >&2
  # A failed run is recorded and the others still run.
  "${cmd[@]}" 2>&1 | tee -a "$R/$name.txt" || echo "# exit status $?" | tee -a "$R/$name.txt"
}

allgather_1x2() {
  # The copy bandwidths that bound 2 ranks on one node (memcpy; process_vm_readv alone and with
  # both processes reading at once, as during an AllGather).
  { echo "\$ build/perf/copybw 32M 7"; "$(dirname "$B")/copybw" 32M 7; } | tee "$R/copybw.txt"
  run allgather_64M_1x2 "$B" allgather --np 2 -b 64M -e 64M -n 20 -w 5 -c 1 --reps 5 --baseline mpi,memcpy
}
reducescatter_1x2() {
  run reducescatter_64M_1x2 "$B" reducescatter --np 2 -b 64M -e 64M -n 20 -w 5 -c 1 --reps 5 --baseline mpi,memcpy
}
emulated_2x2() {
  for coll in allgather reducescatter; do
    run "${coll}_64M_2x2_tcp" $NS -N 2 -L 2 -m mpi -- "$coll" -b 64M -e 64M -n 3 -w 1 -c 1 --reps 5 --baseline ring -v
    run "${coll}_64M_2x2_han" $NS -N 2 -L 2 -m han -- "$coll" -b 64M -e 64M -n 3 -w 1 -c 1 --reps 5 -v
  done
}
small_allgather() {
  # int8, so that 8 B is a whole element per rank on 4 ranks too.
  run allgather_small_1x2 "$B" allgather --np 2 -d int8 -b 8 -e 64K -f 2 -n 200 -w 20 -c 1 --reps 5 --baseline mpi
  run allgather_small_2x2 $NS -N 2 -L 2 -m mpi -- allgather -d int8 -b 8 -e 64K -f 2 -n 50 -w 5 -c 1 --reps 5
  # 2 x 1: no more ranks than cores, where Open MPI's busy polling is not starved (see README)
  run allgather_small_2x1 $NS -N 2 -L 1 -m mpi -- allgather -d int8 -b 8 -e 64K -f 2 -n 50 -w 5 -c 1 --reps 5
}
sweeps_1x2() {
  run sweep_allgather_1x2 "$B" allgather --np 2 -b 1K -e 64M -f 4 -n 10 -w 3 -c 1 --reps 3 --baseline mpi,memcpy
  run sweep_reducescatter_1x2 "$B" reducescatter --np 2 -b 1K -e 64M -f 4 -n 10 -w 3 -c 1 --reps 3 --baseline mpi,memcpy
}
sweeps_2x2() {
  for coll in allgather reducescatter; do
    run "sweep_${coll}_2x2_tcp" $NS -N 2 -L 2 -m mpi -- "$coll" -b 16K -e 64M -f 4 -n 3 -w 1 -c 1 --reps 3 --baseline ring
    run "sweep_${coll}_2x2_han" $NS -N 2 -L 2 -m han -- "$coll" -b 16K -e 64M -f 4 -n 3 -w 1 -c 1 --reps 3
  done
}
plots() {
  for coll in allgather reducescatter; do
    logy=$([[ $coll == reducescatter ]] && echo --logy || true)
    "$PY" "$here/plot.py" -o "$I/${coll}_1x2.png" $logy --title "$coll, 1 node x 2 ranks (shared memory)" \
      "$R/sweep_${coll}_1x2.json"
    "$PY" "$here/plot.py" -o "$I/${coll}_2x2_netns.png" --skip "^han hicoll" \
      --title "$coll, 2 emulated nodes x 2 ranks, 1 Gbit/s links (netns)" \
      "$R/sweep_${coll}_2x2_tcp.json" "$R/sweep_${coll}_2x2_han.json=han"
  done
  "$PY" "$here/plot.py" -o "$I/allgather_small.png" --metric time --logy \
    --title "allgather 8 B - 64 KiB: 1x2 (shm), 2x2 and 2x1 (netns)" \
    "$R/allgather_small_1x2.json=1x2" "$R/allgather_small_2x2.json=2x2" "$R/allgather_small_2x1.json=2x1"
  "$PY" "$here/vs_baselines.py" "$R" >"$R/vs_baselines.md"
  cat "$R/vs_baselines.md"
}

(( $# )) || set -- all
for what in "$@"; do
  case $what in
    allgather_1x2) allgather_1x2 ;; reducescatter_1x2) reducescatter_1x2 ;;
    emulated_2x2) emulated_2x2 ;; small_allgather) small_allgather ;;
    sweeps_1x2) sweeps_1x2 ;; sweeps_2x2) sweeps_2x2 ;; plots) plots ;;
    all) allgather_1x2; reducescatter_1x2; emulated_2x2; small_allgather; sweeps_1x2; sweeps_2x2; plots ;;
    *) echo "unknown: $what" >&2; exit 2 ;;
  esac
done
