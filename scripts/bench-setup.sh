#!/usr/bin/env bash
# Sets up what `prestage bench` needs beyond scripts/dev.sh, in a virtual environment of its own
# (.venv-bench, or $BENCH_VENV): prestage with its PFS emulator (libfuse3), PyTorch + torchvision and
# TensorFlow for the baselines, matplotlib for the figures. It is kept apart from .venv because the
# frameworks take several GB.
#
#   scripts/bench-setup.sh                 system packages (apt), then .venv-bench; skips what is there
#   .venv-bench/bin/prestage bench --help  then see benchmarks/RESULTS.md for the experiment
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

VENV=${BENCH_VENV:-.venv-bench}
APT_PACKAGES=(build-essential cmake ninja-build pkg-config python3-venv python3-dev
              libtbb-dev libturbojpeg0-dev libjpeg62-turbo-dev libzstd-dev zlib1g-dev libhdf5-dev
              libpng-dev libwebp-dev
              fuse3 libfuse3-dev)
PIP_BUILD=(scikit-build-core pybind11 numpy)
# The versions the results in benchmarks/RESULTS.md were measured with.
PIP_RUN=(pillow scikit-image tqdm matplotlib torch==2.14.1 torchvision==0.29.1 tensorflow-cpu==2.21.0)
JOBS=${JOBS:-$(nproc)}

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; exit 1; fi
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
missing=()
for p in "${PIP_BUILD[@]}" "${PIP_RUN[@]}"; do
  "$VENV/bin/python" -m pip show -q "${p%%==*}" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Python packages: ${missing[*]}"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "${missing[@]}"
fi

# A build directory of its own, so that this build never competes with .venv's (build/<wheel tag>).
log "building and installing prestage (and prestage-pfs) into $VENV"
CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps \
  -Cbuild-dir=build/bench-{wheel_tag} .
if [ ! -x "$("$VENV/bin/python" -c 'import prestage, os; print(os.path.dirname(prestage.__file__))')/bin/prestage-pfs" ]; then
  echo "warning: prestage-pfs was not built (libfuse3-dev and pkg-config missing?); --emulate will not work" >&2
fi
log "ready: $VENV/bin/prestage bench --help"
