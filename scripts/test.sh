#!/usr/bin/env bash
# Set up, build, and run every test: ctest (unit, threads, multi-process, MPI, multi-node
# namespaces, sharded training, agbench smoke; GPU tests report skipped without a device),
# then the torch plugin's pytest suite, then the sanitizer tier (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== test: ctest"
(cd build && ctest --output-on-failure -j 2 --timeout 900)

echo "== test: pytest tests/torch"
.venv/bin/python -m pytest -q tests/torch

echo "== test: sanitizers"
bash scripts/sanitize.sh
