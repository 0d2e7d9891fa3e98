#!/usr/bin/env bash
# cibuildwheel's before-all step (pyproject.toml, [tool.cibuildwheel]): builds prestage's C and C++
# libraries from their release sources into /usr/local inside a manylinux_2_28 container, where the
# distribution's are too old (oneTBB 2018, no zstd CMake package) or not fit for a wheel (HDF5 with
# its network drivers). The versions are those of Debian 12, which scripts/wheel.sh builds against.
# zlib, libpng, libwebp and HDF5 are static and position-independent (linked into the extension);
# oneTBB, libjpeg-turbo and zstd are shared (auditwheel bundles them). Needs network access, as
# cibuildwheel's containers have; not run on the development machines (no container runtime).
set -euo pipefail
PREFIX=/usr/local
JOBS=$(nproc)
work=$(mktemp -d)
cd "$work"

fetch() {  # fetch URL: download and unpack into the current directory
  curl -fsSL --retry 3 "$1" | tar -xz
}
cmake_install() {  # cmake_install SRC ARGS...
  local src=$1
  shift
  cmake -S "$src" -B "$src/_build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$PREFIX \
        -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "$@"
  cmake --build "$src/_build" -j "$JOBS"
  cmake --install "$src/_build"
}

yum install -y nasm || true  # libjpeg-turbo's SIMD code; without it the build goes on without SIMD
yum install -y autoconf automake libtool || true  # HDF5's configure, if its tag has none generated

fetch https://github.com/oneapi-src/oneTBB/archive/refs/tags/v2021.8.0.tar.gz
cmake_install oneTBB-2021.8.0 -DTBB_TEST=OFF -DTBBMALLOC_BUILD=OFF -DTBB_STRICT=OFF

fetch https://github.com/libjpeg-turbo/libjpeg-turbo/archive/refs/tags/2.1.5.tar.gz
cmake_install libjpeg-turbo-2.1.5 -DENABLE_STATIC=OFF -DREQUIRE_SIMD=OFF

fetch https://github.com/facebook/zstd/releases/download/v1.5.4/zstd-1.5.4.tar.gz
cmake_install zstd-1.5.4/build/cmake -DZSTD_BUILD_PROGRAMS=OFF -DZSTD_BUILD_STATIC=OFF -DZSTD_BUILD_TESTS=OFF

fetch https://github.com/madler/zlib/releases/download/v1.2.13/zlib-1.2.13.tar.gz
(cd zlib-1.2.13 && CFLAGS="-O2 -fPIC" ./configure --static --prefix=$PREFIX && make -j "$JOBS" libz.a && make install)

fetch https://download.sourceforge.net/libpng/libpng-1.6.39.tar.gz
cmake_install libpng-1.6.39 -DPNG_SHARED=OFF -DPNG_STATIC=ON -DPNG_TESTS=OFF -DPNG_EXECUTABLES=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DZLIB_ROOT=$PREFIX -DZLIB_USE_STATIC_LIBS=ON

fetch https://storage.googleapis.com/downloads.webmproject.org/releases/webp/libwebp-1.2.4.tar.gz
cmake_install libwebp-1.2.4 -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DWEBP_BUILD_ANIM_UTILS=OFF -DWEBP_BUILD_CWEBP=OFF -DWEBP_BUILD_DWEBP=OFF -DWEBP_BUILD_GIF2WEBP=OFF \
  -DWEBP_BUILD_IMG2WEBP=OFF -DWEBP_BUILD_VWEBP=OFF -DWEBP_BUILD_WEBPINFO=OFF -DWEBP_BUILD_WEBPMUX=OFF \
  -DWEBP_BUILD_EXTRAS=OFF

fetch https://github.com/HDFGroup/hdf5/archive/refs/tags/hdf5-1_10_8.tar.gz
[ -x hdf5-hdf5-1_10_8/configure ] || (cd hdf5-hdf5-1_10_8 && ./autogen.sh)
mkdir hdf5-build
(cd hdf5-build &&
   ../hdf5-hdf5-1_10_8/configure --prefix=$PREFIX --disable-shared --enable-static --with-pic \
     --disable-fortran --disable-cxx --disable-java --disable-hl --disable-tests --disable-tools \
     --enable-threadsafe --disable-ros3-vfd --without-szlib --with-zlib=$PREFIX \
     --enable-build-mode=production &&
   make -j "$JOBS" -C src && make -C src install && make -C bin install)
ldconfig
rm -rf "$work"
