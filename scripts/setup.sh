#!/usr/bin/env bash
# Installs what hicoll needs on a fresh Debian 12 machine, creates .venv (torch pinned in
# plugins/torch/requirements.txt, the clients of tests/torch/requirements-clients.txt; a new
# .venv takes them from a venv made once per machine under ~/.cache/hicoll, see below),
# builds everything into build/ (ctest; through ccache, so a rebuild from scratch compiles
# only what changed) and installs hicoll into .venv with pip
# install of the repository root, reusing build/'s libhicoll (HICOLL_BUILD_DIR=build: only the
# torch plugin is compiled, in build/python; .venv's hicoll then loads build/src/libhicoll.so).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "== setup: $*"; }

packages=(build-essential cmake ninja-build pkg-config ccache clang-format git rsync
  libfabric-dev libfabric-bin libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  fortunes-min iproute2 python3-venv)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

requirements=(-r plugins/torch/requirements.txt -r tests/torch/requirements-clients.txt matplotlib)
if [ ! -x .venv/bin/python ] && [ "${HICOLL_VENV_CACHE:-1}" != 0 ]; then
  # A new .venv holds only hicoll: the third-party packages (torch and the clients, ~6 GB)
  # live in one venv per set of requirements under the user's cache, made once per machine,
  # which .venv adds to its path. So a fresh clone on a machine that ran this before installs
  # nothing again. HICOLL_VENV_CACHE=0: everything in .venv.
  py=$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
  key=$( (cat plugins/torch/requirements.txt tests/torch/requirements-clients.txt; echo "matplotlib $py") |
    sha256sum | cut -c1-16)
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/hicoll
  base=$cache/venv-$key
  if [ ! -f "$base/.complete" ]; then
    log "creating the shared package venv $base"
    rm -rf "$base"
    mkdir -p "$cache"
    python3 -m venv "$base"
    "$base/bin/pip" install -q --disable-pip-version-check "${requirements[@]}"
    touch "$base/.complete"
    # Only the newest set of requirements is kept (each is several GB).
    find "$cache" -maxdepth 1 -name 'venv-*' ! -name "venv-$key" -exec rm -rf {} +
  fi
  log "creating .venv over $base"
  python3 -m venv .venv
  echo "import site; site.addsitedir('$base/lib/$py/site-packages')" >".venv/lib/$py/site-packages/_hicoll_packages.pth"
  # The packages' commands (torchrun, pytest ...) run with .venv's python, which sees hicoll.
  for cmd in "$base"/bin/*; do
    name=${cmd##*/}
    [ -e ".venv/bin/$name" ] && continue
    first=
    IFS= read -r first <"$cmd" || true
    case "$first" in "#!$base/bin/python"*) ;; *) continue ;; esac
    printf '#!/bin/sh\nexec "%s/.venv/bin/python" "%s" "$@"\n' "$PWD" "$cmd" >".venv/bin/$name"
    chmod +x ".venv/bin/$name"
  done
else
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  log "pip install -r plugins/torch/requirements.txt -r tests/torch/requirements-clients.txt"
  .venv/bin/pip install -q --disable-pip-version-check "${requirements[@]}"
fi

torch_dir=$(.venv/bin/python -c 'import torch, os; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')
jobs=${HICOLL_BUILD_JOBS:-$(nproc)}
log "cmake build (jobs $jobs)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTorch_DIR="$torch_dir" >/dev/null
ninja -C build -j "$jobs"

log "hicoll into .venv (HICOLL_BUILD_DIR=build pip install --no-build-isolation .)"
HICOLL_BUILD_DIR="$PWD/build" CMAKE_BUILD_PARALLEL_LEVEL=$jobs .venv/bin/pip install -q \
  --disable-pip-version-check --no-build-isolation --no-deps -C build-dir=build/python .
log "hicoll-smddp into .venv (smdistributed.dataparallel.torch.torch_smddp for SMDDP scripts)"
.venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps plugins/torch/smddp
.venv/bin/python -c "import hicoll.torch" && log "import hicoll.torch: ok"
