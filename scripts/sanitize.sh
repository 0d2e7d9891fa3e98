#!/usr/bin/env bash
# Builds and runs the C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer, then under
# ThreadSanitizer (each in its own build directory). Exits non-zero on any report.
#
#   scripts/sanitize.sh            both
#   scripts/sanitize.sh asan|tsan  one
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
JOBS=${JOBS:-$(nproc)}
scripts/dev.sh system  # the build's packages, when run on its own on a fresh machine

run() {
  local name=$1 flags=$2
  shift 2
  echo "== $name ($flags)" >&2
  cmake -S . -B "build/$name" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPRESTAGE_BUILD_TESTS=ON \
        -DPRESTAGE_SANITIZE="$flags" "$@" >/dev/null
  cmake --build "build/$name" -j "$JOBS"
  ctest --test-dir "build/$name" --output-on-failure -j "$JOBS"
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp"

# ThreadSanitizer runs against a oneTBB built with it (scripts/tsan-tbb.sh says why), so that no
# suppression hides what happens on oneTBB's threads.
tsan() {
  local tbb
  tbb=$(scripts/tsan-tbb.sh)
  run tsan thread -DTBB_DIR="$tbb"
}

case "${1:-all}" in
  asan) run asan address,undefined ;;
  tsan) tsan ;;
  all) run asan address,undefined; tsan ;;
  *) echo "usage: $0 [asan|tsan]" >&2; exit 2 ;;
esac
