#!/usr/bin/env bash
# The sanitizer tier (part of scripts/test.sh): the library and its unit, thread and
# multi-process tests built with AddressSanitizer + UndefinedBehaviorSanitizer (any error fails
# the test; only libfabric's own leaks are suppressed, by library name), then the thread tier
# (ranks as threads of one process) under ThreadSanitizer, which must report nothing. Host-only
# builds (no CUDA, MPI, agbench or examples) in build-asan/ and build-tsan/.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${HICOLL_BUILD_JOBS:-$(nproc)}
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHICOLL_WITH_CUDA=OFF -DHICOLL_WITH_MPI=OFF
        -DHICOLL_BUILD_PERF=OFF -DHICOLL_BUILD_EXAMPLES=OFF)

echo "== sanitize: address,undefined build"
cmake -S . -B build-asan "${common[@]}" -DHICOLL_SANITIZE=address,undefined >/dev/null
ninja -C build-asan -j "$jobs" >/dev/null
echo "== sanitize: ctest -L 'unit|threads|multiprocess' under ASan + UBSan"
(cd build-asan && \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  LSAN_OPTIONS="suppressions=$PWD/../tests/sanitizers/lsan.supp" \
  UBSAN_OPTIONS=print_stacktrace=1 \
  ctest -j 2 -L 'unit|threads|multiprocess' -E '^install_' --timeout 600 --output-on-failure)

echo "== sanitize: thread build (the thread tier)"
cmake -S . -B build-tsan "${common[@]}" -DHICOLL_SANITIZE=thread >/dev/null
ninja -C build-tsan -j "$jobs" api_test >/dev/null
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build-tsan/tests/api/api_test
