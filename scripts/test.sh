#!/usr/bin/env bash
# Set up, build, and run every test: ctest (unit, threads, multi-process, MPI, multi-node
# namespaces, sharded training, agbench smoke; GPU tests report skipped without a device),
# then the torch plugin's pytest suite, then the sanitizer tier (scripts/sanitize.sh).
#
#   bash scripts/test.sh --quick   the loop while working, on an existing build: rebuild what
#                                  changed, the format check (scripts/format.sh), the unit and
#                                  thread tiers and a multi-process smoke set (a few minutes on
#                                  2 cores; not what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  [ -f build/build.ninja ] || bash scripts/setup.sh
  ninja -C build -j "${HICOLL_BUILD_JOBS:-$(nproc)}" >/dev/null
  smoke='Collectives.EveryTypeOpAndSizeMatchesTheReference/2x2_contiguous|Agreement.CountsThatDiffer'
  smoke+='|Failure.KilledRankBecomesAnErrorOnEveryOtherRankWithinTheTimeout|NodeMemory.AllocatorContract'
  smoke+='|Resources.FiftyIdleSplitsStaySmall|Concurrent.SecondThreadIsRefusedNamingBothCalls'
  echo "== test --quick: the format check, ctest -L 'unit|threads' and the multi-process smoke set"
  bash scripts/format.sh --check
  cd build
  ctest -j 2 -L 'unit|threads' -E '^(install_|build_)' --timeout 300 --output-on-failure
  ctest -j 2 -R "$smoke" --timeout 300 --output-on-failure
  exit 0
fi
bash scripts/setup.sh

echo "== test: ctest"
(cd build && ctest --output-on-failure -j 2 --timeout 900)

echo "== test: pytest tests/torch"
.venv/bin/python -m pytest -q --durations=15 tests/torch  # the slowest 15: where the time goes

echo "== test: sanitizers"
bash scripts/sanitize.sh
