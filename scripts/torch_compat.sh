#!/usr/bin/env bash
# Builds the hicoll wheel (pip wheel of the repository root: libhicoll + the torch plugin)
# against each torch release named -- default 2.7.1, 2.11.0 and the one pinned in
# plugins/torch/requirements.txt -- in a throwaway venv, installs it there and runs a short
# smoke under torchrun (tests/torch/smoke.py: collectives + 5 FSDP2 steps, backend hicoll,
# 2 ranks). Every step is bounded by a timeout. Not part of CI (it downloads each torch).
#   usage: scripts/torch_compat.sh [-d DIR] [VERSION...]     (DIR: where the venvs go)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=""
while getopts d: o; do
  case $o in d) dir=$OPTARG ;; *) echo "usage: $0 [-d DIR] [VERSION...]" >&2; exit 2 ;; esac
done
shift $((OPTIND - 1))
pinned=$(sed -n 's/^torch==//p' plugins/torch/requirements.txt)
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.7.1 2.11.0 "$pinned")
[ -n "$dir" ] || dir=$(mktemp -d /tmp/hicoll-compat.XXXXXX)
mkdir -p "$dir"
echo "== torch_compat: ${versions[*]} in $dir"

run() {  # run SECONDS LOG CMD...: bounded, output to LOG
  local t=$1 log=$2
  shift 2
  timeout --kill-after=10 "$t" "$@" >>"$log" 2>&1
}

declare -A result
for v in "${versions[@]}"; do
  venv=$dir/torch-$v log=$dir/torch-$v.log
  : >"$log"
  start=$SECONDS
  status=ok
  if [ ! -x "$venv/bin/python" ]; then
    run 120 "$log" python3 -m venv "$venv" || status="venv failed"
  fi
  [ "$status" = ok ] && { run 1800 "$log" "$venv/bin/pip" install -q --disable-pip-version-check \
    "torch==$v" numpy scikit-build-core || status="pip install torch==$v failed"; }
  [ "$status" = ok ] && { rm -rf "$venv/wheel"; run 1800 "$log" env CMAKE_BUILD_PARALLEL_LEVEL="${HICOLL_BUILD_JOBS:-2}" \
    "$venv/bin/pip" wheel -q --no-build-isolation --no-deps -w "$venv/wheel" \
    -C build-dir="$dir/build-$v" "$root" || status="pip wheel failed"; }
  [ "$status" = ok ] && { run 300 "$log" "$venv/bin/pip" install -q --no-deps --force-reinstall \
    "$venv"/wheel/hicoll-*.whl || status="wheel install failed"; }
  if [ "$status" = ok ]; then
    port=$((29500 + RANDOM % 2000))
    run 300 "$log" env OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo HICOLL_TIMEOUT_MS=20000 \
      "$venv/bin/torchrun" --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
      "$root/tests/torch/smoke.py" || status="smoke failed"
  fi
  smoke=$(grep -h "^SMOKE" "$log" | tail -1)
  result[$v]="$status ($((SECONDS - start)) s) ${smoke}"
  echo "== torch $v: ${result[$v]}"
  [ "$status" = ok ] || tail -30 "$log"
done
echo "== torch_compat summary"
fail=0
for v in "${versions[@]}"; do
  echo "torch $v: ${result[$v]}"
  case ${result[$v]} in ok*) ;; *) fail=1 ;; esac
done
exit $fail
