#!/usr/bin/env bash
# Installs what hicoll needs on a fresh Debian 12 machine, creates .venv (torch pinned in
# plugins/torch/requirements.txt, the clients of tests/torch/requirements-clients.txt; pip's
# cache keeps the wheels for the next run), builds everything into build/ (ctest; through ccache,
# so a rebuild from scratch compiles only what changed) and installs hicoll into .venv with pip
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

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
log "pip install -r plugins/torch/requirements.txt -r tests/torch/requirements-clients.txt"
.venv/bin/pip install -q --disable-pip-version-check -r plugins/torch/requirements.txt \
  -r tests/torch/requirements-clients.txt matplotlib

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
