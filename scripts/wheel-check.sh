#!/usr/bin/env bash
# Clean-room check of the portable binary wheel, as a user without a compiler or -dev packages would
# install it (CI runs this last):
#
#   1. scripts/wheel.sh builds the manylinux_2_28 wheel for one CPython (PRESTAGE_WHEEL_ONLY, default
#      cp311), its libraries from the cache or, on a fresh machine, built first;
#   2. `auditwheel show` (printed) and scripts/wheel_libs.py: every ELF file's symbol versions within
#      manylinux_2_28's policy, nothing needed outside the manylinux system set, PyInit_* alone exported;
#   3. scripts/bullseye-check.sh on the wheel: in a fresh virtual environment away from the source
#      tree, with an empty LD_LIBRARY_PATH and only numpy (then h5py), import, an epoch of JPEGs, an
#      epoch of random-resized crops equal pixel for pixel to the development build's, HDF5 rows against
#      h5py's (in the same process too), every sub-command's --help, `prestage demo`; for cp39 in a
#      Debian 11 (bullseye) root as well; and, where PyTorch 2.13.0's CPU build installs (cp311),
#      the wheel side by side with PyTorch and TensorFlow in one process (scripts/wheel_neighbours.py).
#
#   scripts/wheel-check.sh                        all of it, for cp311
#   PRESTAGE_WHEEL_ONLY=cp39 scripts/wheel-check.sh   the cp39 wheel, in bullseye too
#   PRESTAGE_CHECK_NEIGHBOURS=0 ...               without PyTorch and TensorFlow
#
# The data (JPEGs, an HDF5 file, the reference epoch) is made beforehand with the development
# environment (.venv, scripts/dev.sh setup). Prints the time of each step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache=${PRESTAGE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prestage-wheel}
only=${PRESTAGE_WHEEL_ONLY:-cp311}
work=$(mktemp -d "${TMPDIR:-/tmp}/prestage-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

started=$(now)
log "portable wheel for $only"
t=$(now)
PRESTAGE_WHEEL_ONLY=$only scripts/wheel.sh "$work/dist"
wheel=$(ls "$work/dist"/prestage-*-"$only"-*.whl)
echo "wheel build: $(since "$t") s"

log "ELF files of $(basename "$wheel")"
"$cache/venv-$only/bin/auditwheel" show "$wheel"
python3 scripts/wheel_libs.py "$wheel"

log "install and check"
t=$(now)
neighbours=0
[ "$only" = cp311 ] && neighbours=1
PRESTAGE_CHECK_NEIGHBOURS=${PRESTAGE_CHECK_NEIGHBOURS:-$neighbours} scripts/bullseye-check.sh "$wheel" |
  tee "$work/check.log"
echo "checks: $(since "$t") s"
echo "wheel check: $(since "$started") s in all"
passed=$(sed -n 's/^bullseye check: \([0-9]*\) passed, 0 failed$/\1/p' "$work/check.log")
echo "wheel check: $((passed + 1)) passed, 0 failed"  # the checks and wheel_libs.py
