#!/usr/bin/env bash
# Builds oneTBB with ThreadSanitizer into build/tbb-tsan (once; later runs reuse it), from Debian's
# source package of the very version whose headers the project builds against (libtbb-dev), and
# prints the directory of its CMake package (TBBConfig.cmake) for find_package(TBB).
#
# Why: ThreadSanitizer sees only instrumented code. Against the distribution's libtbb it cannot see
# oneTBB's own synchronisation (its task pools, the small-object allocator that recycles task
# memory between threads), and reports races that are not there (a task constructed by one thread
# in memory another thread's task used); suppressing libtbb.so instead hides every report whose
# stack passes through it, which is every access made on a oneTBB worker thread: the decoders'.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$root/build/tbb-tsan
config=$prefix/lib/cmake/TBB
if [ -f "$config/TBBConfig.cmake" ]; then
  echo "$config"
  exit 0
fi
version=$(dpkg-query -W -f='${Version}' libtbb-dev)
work=$root/build/tbb-tsan-src
rm -rf "$work"
mkdir -p "$work/apt/lists/partial" "$work/apt/sources"
# Debian's own mirrors, as the machine's deb lines name them, for source packages: a list of their
# own, so that the machine's apt configuration is left as it is.
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && sed 's/^Types: deb$/Types: deb-src/' "$f" > "$work/apt/sources/$(basename "$f")"
done
if [ -f /etc/apt/sources.list ]; then
  sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > "$work/apt/sources/main.list"
fi
apt_opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/sources"
          -o Dir::State::Lists="$work/apt/lists" -o Debug::NoLocking=1)
echo "== oneTBB $version with ThreadSanitizer: source" >&2
apt-get "${apt_opts[@]}" update -qq >&2
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq "onetbb=$version" 2>&1 |
   grep -v 'unsandboxed as root' >&2 || true)
tar -xf "$work"/onetbb_*.orig.tar.* -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -iname 'onetbb-*' | head -n 1)
echo "== oneTBB $version with ThreadSanitizer: build" >&2
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -Wno-dev -Wno-deprecated -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DTBB_SANITIZE=thread -DTBB_TEST=OFF \
      -DTBBMALLOC_BUILD=OFF -DTBB_STRICT=OFF -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build "$work/build" -j "${JOBS:-$(nproc)}" >/dev/null 2>&1 ||
  cmake --build "$work/build" -j 1  # again, to show the error
cmake --install "$work/build" >/dev/null
rm -rf "$work"
echo "$config"
