#!/usr/bin/env bash
# Checks portable wheels (scripts/wheel.sh) where users install them: the cp39 wheel in a Debian 11
# (bullseye) userland (glibc 2.31, GCC 10's libstdc++, Python 3.9, pip 20.3), every wheel on this
# machine with its CPython. For each, in a fresh virtual environment with the wheel and numpy only
# (then h5py for the last check), away from the source tree, with an empty LD_LIBRARY_PATH:
#
#   - scripts/wheel_smoke.py: import; an epoch of 200 JPEGs; PNG and WebP files; an epoch with random-resized-crop equal,
#     pixel for pixel, to the same epoch from the development build (.venv, scripts/dev.sh setup);
#     HDF5 rows against h5py's file; `prestage <sub> --help` for every sub-command; `prestage demo`;
#   - scripts/wheel_smoke.py --h5py: h5py installed too, the rows by prestage and by h5py in one
#     process, each with its own HDF5 library;
#   - with PRESTAGE_CHECK_NEIGHBOURS=1, on this machine where PyTorch 2.13.0 (CPU) installs for the
#     wheel's CPython: PyTorch and TensorFlow installed too, scripts/wheel_neighbours.py: both
#     import orders, the adaptors' epochs, a C++ exception caught in Python (see that file).
#
#   scripts/bullseye-check.sh WHEEL...
#
# The Debian 11 root is made once with debootstrap from Debian's mirror (about 2 minutes) and kept in
# the cache (PRESTAGE_WHEEL_CACHE, default ~/.cache/prestage-wheel); each run copies it, so every
# run starts from a clean root. The root has no network access of its own here: numpy and h5py for
# Python 3.9 are downloaded on this machine (pip download) and installed from that folder. Runs as
# root (chroot, mounts in a private mount namespace: nothing stays mounted). Ends with a table and
# 'N passed, 0 failed'.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 WHEEL..." >&2; exit 2; }
cache=${PRESTAGE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prestage-wheel}
mirror=${PRESTAGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
wheels=()
for w in "$@"; do wheels+=("$(realpath "$w")"); done
work=$(mktemp -d "${TMPDIR:-/tmp}/prestage-bullseye-check.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
clean=(env -u PYTHONPATH -u PYTHONHOME -u PIP_FIND_LINKS LD_LIBRARY_PATH= PIP_DISABLE_PIP_VERSION_CHECK=1)
results=()
passed=0

# count LOG: the checks the smoke runs in LOG passed.
count() { grep -c '^ok ' "$1" || true; }

log "data: 200 JPEGs, an HDF5 file, the reference epoch (development build)"
cd "$root"
[ -x .venv/bin/prestage ] || scripts/dev.sh setup
mkdir -p "$work/share"
.venv/bin/prestage synth "$work/share/data/images" --images 200 --classes 4 --quiet
.venv/bin/python - "$work/share/data" <<'EOF'
import sys
import h5py
import numpy as np
rows = np.random.default_rng(0).normal(size=(24, 8, 5)).astype("<f4")
with h5py.File(sys.argv[1] + "/fields.h5", "w") as f:
    f.create_dataset("x", data=rows, chunks=(4, 8, 5), compression="gzip")
np.save(sys.argv[1] + "/fields.npy", rows)
# PNG and WebP (lossless and lossy), and Pillow's pixels of each: the oracle of decode="image".
import os
from PIL import Image
rng = np.random.default_rng(1)
os.makedirs(sys.argv[1] + "/others/a")
pixels = []
for i, (fmt, args) in enumerate([("PNG", {}), ("WEBP", {"lossless": True}), ("WEBP", {"quality": 80}),
                                 ("PNG", {})] * 2):
    path = f"{sys.argv[1]}/others/a/{i}.{fmt.lower()}"
    Image.fromarray(rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(path, fmt, **args)
    with Image.open(path) as im:
        pixels.append(np.asarray(im.convert("RGB")))
np.save(sys.argv[1] + "/others.npy", np.stack(pixels))
EOF
.venv/bin/python scripts/wheel_smoke.py --write-reference "$work/share/reference.npz" "$work/share/data"
rm -rf "$work/share/data/stage-rrc"
cp scripts/wheel_smoke.py scripts/wheel_neighbours.py "$work/share/"

# interpreter VERSION: this machine's CPython VERSION (3.N): python3.N on PATH or pyenv's.
interpreter() {
  local v=$1 py
  for py in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python3; do
    if "$py" -c 'import sys, venv' 2>/dev/null && [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$v" ]; then
      command -v "$py"
      return
    fi
  done
}

# bullseye_root: prints the cached Debian 11 root, made with debootstrap if missing.
bullseye_root() {
  local dir=$cache/bullseye-root
  if [ ! -f "$dir/.complete" ]; then
    command -v debootstrap >/dev/null || "$root/scripts/dev.sh" system debootstrap >&2
    log "Debian 11 root: debootstrap --variant=minbase bullseye (once)"
    rm -rf --one-file-system "$dir" "$dir.new"
    debootstrap --variant=minbase --include=python3,python3-venv bullseye "$dir.new" "$mirror" \
      >"$cache/bullseye-root.log" 2>&1 || { tail -n 20 "$cache/bullseye-root.log" >&2; exit 1; }
    touch "$dir.new/.complete"
    mv "$dir.new" "$dir"
  fi
  echo "$dir"
}

# in_bullseye ROOT COMMAND: runs COMMAND (sh) in ROOT, with /proc, /sys, /dev and $work/share (as
# /share) mounted in a private mount namespace.
in_bullseye() {
  local r=$1 cmd=$2
  mkdir -p "$r/share"
  unshare --mount --propagation private -- sh -c '
    set -e
    r=$1
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mount --bind "$2" "$r/share"
    exec chroot "$r" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
      PIP_DISABLE_PIP_VERSION_CHECK=1 sh -c "$3"' sh "$r" "$work/share" "$cmd"
}

for wheel in "${wheels[@]}"; do
  name=$(basename "$wheel")
  tag=$(echo "$name" | sed -n 's/^prestage-[^-]*-\(cp[0-9]*\)-.*/\1/p')
  v=$(echo "$tag" | sed 's/^cp3\([0-9]*\)$/3.\1/')
  cp "$wheel" "$work/share/"

  if [ "$tag" = cp39 ]; then
    r=$(bullseye_root)
    log "$name: Debian 11 (bullseye)"
    mkdir -p "$work/share/wheels39"
    # The tags a glibc 2.31 system takes, named one by one (pip download does not widen a --platform).
    python3 -m pip download -q --dest "$work/share/wheels39" --only-binary=:all: --python-version 3.9 \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_31_x86_64 numpy h5py
    rm -rf --one-file-system "$work/root"
    cp -a "$r" "$work/root"
    t=$(now)
    in_bullseye "$work/root" "
      set -e
      cat /etc/debian_version; ldd --version | head -n 1; python3 --version
      cd /root && python3 -m venv /root/venv && /root/venv/bin/pip --version
      /root/venv/bin/pip install -q --no-index --find-links /share/wheels39 /share/$name
      /root/venv/bin/python -c 'import numpy, prestage; print(\"installed:\", prestage.__file__, numpy.__version__)'
      /root/venv/bin/python /share/wheel_smoke.py --reference /share/reference.npz /share/data
      /root/venv/bin/pip install -q --no-index --find-links /share/wheels39 h5py
      /root/venv/bin/python /share/wheel_smoke.py --h5py /share/data
    " 2>&1 | tee "$work/bullseye-$tag.log"
    rm -rf --one-file-system "$work/root" "$work/share/data/stage" "$work/share/data/stage-rrc"
    n=$(count "$work/bullseye-$tag.log")
    passed=$((passed + n))
    results+=("$(printf '%-8s %-22s %3d checks  %6s s' "$tag" "Debian 11 (bullseye)" "$n" "$(since "$t")")")
  fi

  py=$(interpreter "$v")
  if [ -z "$py" ]; then
    echo "no CPython $v on this machine (PATH or pyenv): $name not checked here" >&2
    exit 1
  fi
  log "$name: this machine ($(. /etc/os-release && echo "$PRETTY_NAME"), $("$py" -V))"
  t=$(now)
  mkdir -p "$work/room"
  (cd "$work/room" &&
     "${clean[@]}" "$py" -m venv "$work/venv-$tag" &&
     "${clean[@]}" "$work/venv-$tag/bin/python" -m pip install -q "$wheel" &&
     "${clean[@]}" "$work/venv-$tag/bin/python" "$work/share/wheel_smoke.py" \
       --reference "$work/share/reference.npz" "$work/share/data" "$root" "$cache" &&
     "${clean[@]}" "$work/venv-$tag/bin/python" -m pip install -q h5py &&
     "${clean[@]}" "$work/venv-$tag/bin/python" "$work/share/wheel_smoke.py" --h5py "$work/share/data") 2>&1 |
    tee "$work/host-$tag.log"
  if [ "${PRESTAGE_CHECK_NEIGHBOURS:-0}" = 1 ]; then
    (cd "$work/room" &&
       "${clean[@]}" PIP_FIND_LINKS="${PIP_FIND_LINKS:-}" "$work/venv-$tag/bin/python" -m pip install -q \
         torch==2.13.0 tensorflow-cpu &&
       "${clean[@]}" "$work/venv-$tag/bin/python" "$work/share/wheel_neighbours.py" "$work/share/data") 2>&1 |
      tee -a "$work/host-$tag.log"
  fi
  rm -rf "$work/venv-$tag" "$work/share/data/stage" "$work/share/data/stage-rrc"
  n=$(count "$work/host-$tag.log")
  passed=$((passed + n))
  results+=("$(printf '%-8s %-22s %3d checks  %6s s' "$tag" "$(. /etc/os-release && echo "Debian $VERSION_ID") (this machine)" "$n" "$(since "$t")")")
done

echo
echo "wheel    userland               checks      time"
printf '%s\n' "${results[@]}"
echo "bullseye check: $passed passed, 0 failed"
