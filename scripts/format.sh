#!/usr/bin/env bash
# The house style (.clang-format) on every tracked C and C++ file.
#   bash scripts/format.sh           rewrite the files in place
#   bash scripts/format.sh --check   list the files that differ and fail (the quick tier runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "format: clang-format is not installed (apt-get install clang-format)" >&2
  exit 2
fi
# CUDA sources (.cu) are left as they are: clang-format 14 splits their <<<...>>> launches.
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.h' '*.hpp')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    printf 'format: %s differs from .clang-format\n' "${bad[@]}" >&2
    echo "format: ${#bad[@]} file(s); run: bash scripts/format.sh" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files follow .clang-format ($($cf --version | grep -o 'version [0-9.]*'))"
  exit 0
fi
"$cf" -i "${files[@]}"
