#!/usr/bin/env bash
# The C++ tree (cpp/, python/src/, tests/cpp/, fuzz/, benchmarks/, examples/) in the house format,
# .clang-format (Google's, 100 columns), by the clang-format pinned in scripts/dev.sh's test tools
# (each version formats a little differently).
#
#   scripts/format.sh          rewrites the files that are not in it
#   scripts/format.sh --check  rewrites nothing; lists them and exits 1 (tests/python/test_format.py)
set -euo pipefail
cd "$(dirname "$0")/.."

binary=${CLANG_FORMAT:-.venv/bin/clang-format}
if [ ! -x "$binary" ]; then
  echo "no $binary: scripts/dev.sh setup installs it (or set CLANG_FORMAT)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
  "$binary" --dry-run -Werror "${files[@]}"
else
  "$binary" -i "${files[@]}"
fi
