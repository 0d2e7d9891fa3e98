# Spack recipe for prestage. Use it from a repository of your own:
#   spack repo create myrepo && cp -r packaging/spack/prestage myrepo/packages/
#   spack install prestage +mpi ^openmpi
# tests/python/test_packaging.py checks its version and dependencies against pyproject.toml and
# CMakeLists.txt.

from spack.package import *


class Prestage(PythonPackage):
    """Overlap staging from a parallel file system to node-local SSD with mini-batch decoding: a C++
    data loader (oneTBB flow graph) with Python bindings, PyTorch and TensorFlow adaptors."""

    # The project publishes no repository address yet: set both to where your copy lives (or use
    # `spack develop prestage@0.1.0` on a checkout).
    homepage = "https://example.invalid/prestage"
    git = "https://example.invalid/prestage.git"

    license("Apache-2.0")

    version("0.1.0", tag="v0.1.0")

    variant("mpi", default=True, description="Build libprestage_mpi, the peer tier's MPI plugin")
    variant("pfs", default=False, description="Build prestage-pfs, the emulated parallel file system (FUSE)")

    # pyproject.toml: [build-system] and [project]
    depends_on("python@3.9:", type=("build", "run"))
    depends_on("py-scikit-build-core@0.10:", type="build")
    depends_on("py-pybind11@2.12:", type="build")
    depends_on("cmake@3.21:", type="build")
    depends_on("ninja", type="build")
    depends_on("py-numpy@1.22:", type=("build", "run"))

    # CMakeLists.txt: find_package(... REQUIRED)
    depends_on("intel-oneapi-tbb")
    depends_on("libjpeg-turbo")
    depends_on("zstd")
    depends_on("zlib-api")
    depends_on("libpng")
    depends_on("libwebp")
    depends_on("hdf5~mpi api=default")

    # CMakeLists.txt: optional parts
    depends_on("mpi", when="+mpi")
    depends_on("libfuse@3.12:", when="+pfs")
    depends_on("pkgconfig", type="build", when="+pfs")

    def config_settings(self, spec, prefix):
        return {
            "cmake.define.PRESTAGE_BUILD_MPI": "ON" if spec.satisfies("+mpi") else "OFF",
            "cmake.define.PRESTAGE_BUILD_PFS_EMULATOR": "ON" if spec.satisfies("+pfs") else "OFF",
            "cmake.define.HDF5_ROOT": spec["hdf5"].prefix,
        }
