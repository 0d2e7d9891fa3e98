#!/usr/bin/env bash
# Clean-room check of the binary wheel, as a user without a compiler or -dev packages would install it:
#
#   1. scripts/wheel.sh builds the wheel for python3;
#   2. scripts/wheel_libs.py (and `auditwheel show`, printed): only the expected libraries bundled,
#      nothing else needed outside the manylinux system set, no CUDA library;
#   3. a fresh virtual environment outside the repository, created and used with an empty
#      LD_LIBRARY_PATH, no PYTHONPATH and a working directory away from the source tree, gets the
#      wheel with its required dependencies only (numpy); scripts/wheel_smoke.py then checks there:
#      import, one epoch of 200 JPEGs and its first batch, HDF5 rows against h5py's, that no library
#      came from the build tree, `prestage <sub> --help` for every sub-command and `prestage demo`;
#   4. with PyTorch installed into it (torch==2.13.0, the CPU build), the PyTorch adaptor on 3 batches.
#
#   scripts/wheel-check.sh            all of it
#   PRESTAGE_WHEEL_CHECK_TORCH=0 ...  without step 4
#
# The data (JPEGs, an HDF5 file and its rows) is made beforehand with the development environment
# (.venv, scripts/dev.sh setup), which has Pillow, scikit-image and h5py. Prints the time of each step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache=${PRESTAGE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prestage-wheel}
work=$(mktemp -d "${TMPDIR:-/tmp}/prestage-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

started=$(now)
py=$(python3 -c 'import sys; print(sys.executable)')
tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')

log "wheel for $tag"
t=$(now)
PRESTAGE_WHEEL_PYTHONS=$py scripts/wheel.sh "$work/dist"
wheel=$(ls "$work/dist"/prestage-*-"$tag"-*.whl)
echo "wheel build: $(since "$t") s"

log "libraries of $(basename "$wheel")"
"$cache/venv-$tag/bin/auditwheel" show "$wheel"
"$py" scripts/wheel_libs.py "$wheel"

log "data: 200 JPEGs, an HDF5 file (development environment)"
[ -x .venv/bin/prestage ] || scripts/dev.sh setup
.venv/bin/prestage synth "$work/data/images" --images 200 --classes 4 --quiet
.venv/bin/python - "$work/data" <<'EOF'
import sys
import h5py
import numpy as np
rows = np.random.default_rng(0).normal(size=(24, 8, 5)).astype("<f4")
with h5py.File(sys.argv[1] + "/fields.h5", "w") as f:
    f.create_dataset("x", data=rows, chunks=(4, 8, 5), compression="gzip")
np.save(sys.argv[1] + "/fields.npy", rows)
EOF

# The clean room: the interpreter itself, nothing of this shell's library or module paths, and a
# working directory where no source tree is importable.
clean=(env -u PYTHONPATH -u PYTHONHOME LD_LIBRARY_PATH= PIP_DISABLE_PIP_VERSION_CHECK=1)
mkdir -p "$work/room"
cd "$work/room"
log "fresh virtual environment: pip install the wheel"
"${clean[@]}" "$py" -m venv "$work/venv"
t0=$(now)
"${clean[@]}" "$work/venv/bin/python" -m pip install -q "$wheel"
echo "pip install of the wheel (and numpy): $(since "$t0") s"
log "smoke test"
t=$(now)
"${clean[@]}" PRESTAGE_CHECK_T0="$t0" "$work/venv/bin/python" "$root/scripts/wheel_smoke.py" "$work/data" "$root" "$cache" |
  tee "$work/smoke.log"
echo "smoke test: $(since "$t") s"

if [ "${PRESTAGE_WHEEL_CHECK_TORCH:-1}" != 0 ]; then
  log "PyTorch adaptor: pip install torch==2.13.0"
  t=$(now)
  "${clean[@]}" "$work/venv/bin/python" -m pip install -q torch==2.13.0
  echo "pip install torch: $(since "$t") s"
  "${clean[@]}" "$work/venv/bin/python" "$root/scripts/wheel_smoke.py" --torch "$work/data" |
    tee -a "$work/smoke.log"
fi
echo "wheel check: $(since "$started") s in all"
passed=0
while read -r n; do passed=$((passed + n)); done < <(sed -n 's/^wheel smoke: \([0-9]*\) passed, 0 failed$/\1/p' "$work/smoke.log")
echo "wheel check: $((passed + 1)) passed, 0 failed"  # the smoke tests' checks and wheel_libs.py
