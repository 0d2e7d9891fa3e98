#!/usr/bin/env bash
# Builds the libFuzzer harnesses in fuzz/ with clang (AddressSanitizer + UndefinedBehaviorSanitizer)
# and runs each for a while, starting from its seed corpus. Exits non-zero if any harness reports a
# crash, a sanitizer error, an uncaught exception, a timeout, a leak or an allocation over the limit,
# or if a saved reproducer of a fixed finding fails again.
#
#   scripts/fuzz.sh                 every harness for 30 s (CI), hdf5 excepted
#   scripts/fuzz.sh 600             every harness for 10 minutes, hdf5 excepted
#   scripts/fuzz.sh 600 jpeg hdf5   only these harnesses
#   scripts/fuzz.sh replay          every seed and every saved reproducer once (no fuzzing)
#
# Saved reproducers of findings (fuzz/crashes/) run first: fuzz/README.md says how they and the
# list of open findings (fuzz/crashes/OPEN) are kept.
#
# Environment: FUZZ_BUILD (build directory, default build/fuzz), FUZZ_PARALLEL (harnesses run at
# once, default 1), FUZZ_NICE (niceness of the runs, default 0), JOBS (build parallelism).
# Each run keeps what it found in $FUZZ_BUILD/corpus/<name> (new inputs), artifacts/<name>/
# (crashing inputs) and logs/<name>.log; fuzz/README.md says how to minimise and save a crash.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

build=${FUZZ_BUILD:-build/fuzz}
parallel=${FUZZ_PARALLEL:-1}
niceness=${FUZZ_NICE:-0}
JOBS=${JOBS:-$(nproc)}

mode=run
seconds=30
if [ $# -gt 0 ]; then
  case "$1" in
    replay) mode=replay ;;
    ''|*[!0-9]*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    *) seconds=$1 ;;
  esac
  shift
fi
# hdf5 runs only when named: the parsing it reaches is Debian's HDF5 library's, which is not
# instrumented and has open findings of its own (fuzz/README.md), so it would make CI fail at random.
if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  harnesses=()
  for f in fuzz/*_fuzzer.cpp; do
    n=$(basename "$f" _fuzzer.cpp)
    [ "$n" = hdf5 ] || harnesses+=("$n")
  done
fi

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

# clang and its libFuzzer runtime, with the build's own packages: a fresh machine has none of them.
scripts/dev.sh system clang libclang-rt-dev
log "building the harnesses in $build (clang, address,undefined,fuzzer-no-link)"
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPRESTAGE_BUILD_FUZZERS=ON -DPRESTAGE_SANITIZE=address,undefined,fuzzer-no-link \
  -DPRESTAGE_BUILD_TESTS=OFF -DPRESTAGE_BUILD_PFS_EMULATOR=OFF -DPRESTAGE_INSTALL=OFF >/dev/null
targets=()
for n in "${harnesses[@]}"; do targets+=("${n}_fuzzer"); done
cmake --build "$build" -j "$JOBS" --target "${targets[@]}"

# malloc returns null for an impossible size, as glibc's does, so the C libraries' own checks run
# (operator new still reports it); libFuzzer's -malloc_limit_mb catches large allocations that
# succeed.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/fuzz/lsan.supp}

bin_of() { echo "$build/fuzz/$1_fuzzer"; }
# A unit slower than 10 s is a hang; more than 2 GB resident or one allocation over 512 MB is a
# finding (every harness bounds its own outputs far below that).
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512)

mkdir -p "$build/logs"
status=0

# Saved reproducers (fuzz/crashes/<harness>-<name>) first. One that no longer fails is a regression
# test that passes. One that still fails is an open finding if fuzz/crashes/OPEN lists it (the
# harness is then not fuzzed: it would stop at the same bug), else a regression, which fails the run.
open_list=fuzz/crashes/OPEN
listed_open() { grep -qxF "$(basename "$1")" "$open_list" 2>/dev/null; }
declare -A blocked=()
for n in "${harnesses[@]}"; do
  for r in fuzz/crashes/"$n"-*; do
    [ -e "$r" ] || continue
    if "$(bin_of "$n")" "${limits[@]}" -runs=1 "$r" >"$build/logs/reproducer-$(basename "$r").log" 2>&1; then
      if listed_open "$r"; then log "$r no longer fails: take it off $open_list"; fi
    elif listed_open "$r"; then
      log "$n: open finding $r (see $open_list): not fuzzed"
      blocked[$n]=$r
    else
      log "$n: $r fails again (regression; log: $build/logs/reproducer-$(basename "$r").log)"
      status=1
    fi
  done
done

if [ "$mode" = replay ]; then
  for n in "${harnesses[@]}"; do
    [ -z "${blocked[$n]:-}" ] || continue
    inputs=(fuzz/corpus/"$n"/*)
    log "$n: replaying ${#inputs[@]} seeds"
    if ! "$(bin_of "$n")" "${limits[@]}" -runs=1 "${inputs[@]}" >"$build/logs/replay-$n.log" 2>&1; then
      tail -n 40 "$build/logs/replay-$n.log" >&2
      log "$n: FAILED (log: $build/logs/replay-$n.log)"
      status=1
    fi
  done
  exit $status
fi

mkdir -p "$build/logs"
# Runs one harness; its exit status and libFuzzer's final statistics go to logs/<name>.{rc,log}.
run_one() {
  local n=$1
  local work="$build/corpus/$n" artifacts="$build/artifacts/$n"
  mkdir -p "$work" "$artifacts"
  local rc=0
  # New inputs go to the first directory (the work corpus); fuzz/corpus/<name> is only read.
  nice -n "$niceness" "$(bin_of "$n")" -max_total_time="$seconds" "${limits[@]}" \
    -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "$work" "fuzz/corpus/$n" >"$build/logs/$n.log" 2>&1 || rc=$?
  echo "$rc" >"$build/logs/$n.rc"
}

runnable=()
for n in "${harnesses[@]}"; do [ -n "${blocked[$n]:-}" ] || runnable+=("$n"); done
log "fuzzing ${runnable[*]} for ${seconds}s each, $parallel at a time"
running=0
for n in "${runnable[@]}"; do
  rm -f "$build/logs/$n.rc"
  run_one "$n" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

printf '%-12s %8s %14s %12s %s\n' harness seconds executions corpus result
for n in "${harnesses[@]}"; do
  if [ -n "${blocked[$n]:-}" ]; then
    printf '%-12s %8s %14s %12s %s\n' "$n" - - - "not fuzzed: open finding ${blocked[$n]}"
    continue
  fi
  logf="$build/logs/$n.log"
  rc=$(cat "$build/logs/$n.rc" 2>/dev/null || echo missing)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logf" | tail -n 1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$logf" | tail -n 1)
  # libFuzzer's corpus at the end: inputs/bytes, after it dropped those that add nothing.
  corpus=$(sed -n 's/^#[0-9]*[[:space:]]*DONE .* corp: \([^ ]*\) .*/\1/p' "$logf" | tail -n 1)
  result=ok
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc; log: $logf)"
    status=1
  fi
  printf '%-12s %8s %14s %12s %s\n' "$n" "${secs:--}" "${execs:--}" "${corpus:--}" "$result"
done
for n in "${runnable[@]}"; do
  if [ "$(cat "$build/logs/$n.rc" 2>/dev/null || echo 1)" != 0 ]; then
    log "$n: last lines of $build/logs/$n.log"
    grep -E 'ERROR|SUMMARY|Test unit written|#[0-9]+ +(DONE|NEW|REDUCE)|==[0-9]+==|fuzz invariant|terminate|what\(\)' \
      "$build/logs/$n.log" | tail -n 25 >&2 || true
  fi
done
exit $status
