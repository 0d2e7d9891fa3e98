#!/usr/bin/env bash
# Sets up everything prestage needs on a Debian machine and runs its main jobs.
#
#   scripts/dev.sh setup   system packages (apt), .venv with the Python package and its test tools
#   scripts/dev.sh system [PKG...]   only the system packages that the C++ build needs, and PKG...
#   scripts/dev.sh demo    setup, then `prestage demo` on a built-in synthetic data set
#   scripts/dev.sh test    setup, then the C++ tests (doctest through CTest) and the Python tests
#
# Each step skips what is already in place, so running it again is cheap.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

APT_PACKAGES=(build-essential cmake ninja-build pkg-config python3-venv python3-dev
              libtbb-dev libturbojpeg0-dev libjpeg62-turbo-dev libzstd-dev zlib1g-dev libhdf5-dev doctest-dev
              libpng-dev libwebp-dev
              fuse3 libfuse3-dev
              openmpi-bin libopenmpi-dev)  # the peer tier's MPI plugin and its tests (mpirun)
PIP_BUILD=(scikit-build-core pybind11 numpy)
PIP_RUN=(pillow scikit-image tqdm matplotlib)
# torch pinned: a range pulls a CUDA build. mpi4py: the peer tier's tests hand the loader mpi4py's own
# objects as comm= (its wheel runs on the Open MPI installed above).
# pyarrow, datasets: Catalog.from_hf is tested on sets that datasets itself writes. clang-format
# pinned: each version formats a little differently (scripts/format.sh, tests/python/test_format.py).
PIP_TEST=(pytest mypy h5py zstandard torch==2.13.0 tensorflow-cpu mpi4py webdataset pyarrow datasets
          clang-format==23.1.5)
JOBS=${JOBS:-$(nproc)}

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; exit 1; fi
}

# setup_system [PKG...]: the build's system packages and PKG..., those that are missing.
setup_system() {
  local missing=()
  for p in "${APT_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing system packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# setup_python PACKAGE...: the packages (pip requirement strings) that are missing, then prestage.
setup_python() {
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  local missing=()
  for p in "$@"; do
    .venv/bin/python -m pip show -q "${p%%[=<>]*}" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Python packages: ${missing[*]}"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q "${missing[@]}"
  fi
  # Incremental: scikit-build-core keeps its CMake build in build/<wheel tag>.
  log "building and installing prestage into .venv"
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS .venv/bin/python -m pip install -q --no-build-isolation --no-deps .
}

build_cpp_tests() {
  log "building the C++ tests"
  cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPRESTAGE_BUILD_TESTS=ON >/dev/null
  cmake --build build/cpp -j "$JOBS"
}

setup() {
  setup_system
  setup_python "${PIP_BUILD[@]}" "${PIP_RUN[@]}" "$@"
}

cmd=${1:-}
shift || true
case "$cmd" in
  system)
    setup_system "$@"
    ;;
  setup)
    setup "${PIP_TEST[@]}"
    ;;
  demo)
    setup
    .venv/bin/prestage demo "$@"
    ;;
  test)
    setup "${PIP_TEST[@]}"
    build_cpp_tests
    log "C++ tests"
    ctest --test-dir build/cpp --output-on-failure -j "$JOBS"
    log "C++ example, built against the installed package"
    rm -rf build/install
    cmake --install build/cpp --prefix build/install >/dev/null
    cmake -S examples/cpp -B build/example -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
          -DCMAKE_PREFIX_PATH="$root/build/install" >/dev/null
    cmake --build build/example
    if [ -x /usr/bin/cmake ] && [ "$(command -v cmake)" != /usr/bin/cmake ]; then
      # The distribution's own CMake as well, where another comes first on PATH: it is the one a
      # fresh machine has.
      /usr/bin/cmake -S examples/cpp -B build/example-system-cmake -G Ninja \
                     -DCMAKE_PREFIX_PATH="$root/build/install" >/dev/null
      /usr/bin/cmake --build build/example-system-cmake
    fi
    .venv/bin/prestage synth build/example-data --images 48 --classes 3 --quiet --overwrite
    build/example/prestage_example build/example-data --batch-size 16 --image-size 32 32 --epochs 2
    log "Python tests"
    .venv/bin/python -m pytest "$@"
    ;;
  *)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
