"""The Spack recipe (packaging/spack/prestage/package.py) and the conda-forge style recipe
(packaging/conda/meta.yaml) agree with the build's own files: the version (pyproject.toml and CMakeLists.txt),
the Python, build-system and run requirements (pyproject.toml), and every library CMakeLists.txt finds
(a new find_package fails here until both recipes name it), the optional MPI and FUSE parts as Spack variants."""

import ast
import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
# CMake package -> (Spack package, conda-forge package); None: part of the toolchain.
LIBRARIES = {
    "Threads": (None, None),
    "TBB": ("intel-oneapi-tbb", "tbb-devel"),
    "libjpeg-turbo": ("libjpeg-turbo", "libjpeg-turbo"),
    "zstd": ("zstd", "zstd"),
    "ZLIB": ("zlib-api", "zlib"),
    "HDF5": ("hdf5", "hdf5"),
    "PNG": ("libpng", "libpng"),
    "WebP": ("libwebp", "libwebp"),
}
SPACK_NAME = {"python": "python", "cmake": "cmake"}  # else py-<name>


def _cmake() -> Tuple[str, str, List[str], List[str]]:
    text = (ROOT / "CMakeLists.txt").read_text()
    version = re.search(r"project\(prestage VERSION ([0-9.]+)", text).group(1)
    minimum = re.search(r"cmake_minimum_required\(VERSION ([0-9.]+)\)", text).group(1)
    required = re.findall(r"find_package\(([\w-]+)[^)]*\bREQUIRED\b", text)
    optional = re.findall(r"find_package\((MPI)\b", text) + re.findall(r"pkg_check_modules\(\w+ QUIET (fuse3)", text)
    return version, minimum, required, optional


def _pyproject() -> Dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lower_bound(requirement: str) -> Tuple[str, str]:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement.strip())
    assert m, f"only NAME>=VERSION requirements are mapped, not {requirement!r}"
    return m.group(1).lower(), m.group(2)


def _spack() -> Tuple[List[str], Dict[str, str], List[str], List[str]]:
    """versions, depends_on spec -> its `when` ('' if none), variants, and the module's syntax is Python."""
    tree = ast.parse((ROOT / "packaging/spack/prestage/package.py").read_text())
    versions, depends, variants = [], {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            first = node.args[0]
            if not isinstance(first, ast.Constant):
                continue
            if node.func.id == "version":
                versions.append(first.value)
            elif node.func.id == "depends_on":
                when = next((k.value.value for k in node.keywords if k.arg == "when"), "")
                depends[first.value] = when
            elif node.func.id == "variant":
                variants.append(first.value)
    return versions, depends, variants, [c.name for c in tree.body if isinstance(c, ast.ClassDef)]


def _conda() -> Tuple[str, Dict[str, List[str]]]:
    text = (ROOT / "packaging/conda/meta.yaml").read_text()
    version = re.search(r'{%\s*set version = "([^"]+)"\s*%}', text).group(1)
    sections: Dict[str, List[str]] = {}
    current = None
    in_requirements = False
    for line in text.splitlines():
        if re.match(r"^\S", line):
            in_requirements = line.startswith("requirements:")
            current = None
        elif in_requirements and re.match(r"^  (\w+):\s*$", line):
            current = line.strip()[:-1]
            sections[current] = []
        elif in_requirements and current and line.strip().startswith("- "):
            sections[current].append(line.strip()[2:].split("#")[0].strip())
    return version, sections


def _spack_spec(name: str, bound: str) -> str:
    return f"{SPACK_NAME.get(name, 'py-' + name)}@{bound}:"


def test_versions_agree():
    version, _, _, _ = _cmake()
    assert _pyproject()["project"]["version"] == version
    versions, _, _, classes = _spack()
    assert versions == [version] and classes == ["Prestage"]
    assert _conda()[0] == version


def test_every_library_cmake_requires_is_in_both_recipes():
    _, _, required, _ = _cmake()
    assert set(required) == set(LIBRARIES), "a new find_package(... REQUIRED): map it here and in the recipes"
    _, depends, _, _ = _spack()
    spack_names = {re.split(r"[@~+ ]", spec)[0]: when for spec, when in depends.items()}
    _, conda = _conda()
    conda_host = {re.split(r"[ >=<]", r)[0] for r in conda["host"]}
    for cmake_name in required:
        spack_name, conda_name = LIBRARIES[cmake_name]
        if spack_name:
            assert spack_names.get(spack_name) == "", f"Spack: {spack_name} (for {cmake_name}) unconditional"
        if conda_name:
            assert conda_name in conda_host, f"conda: {conda_name} (for {cmake_name}) in host"


def test_optional_parts_are_spack_variants():
    _, _, _, optional = _cmake()
    assert sorted(optional) == ["MPI", "fuse3"]
    _, depends, variants, _ = _spack()
    assert {"mpi", "pfs"} <= set(variants)
    assert depends.get("mpi") == "+mpi"
    fuse_minimum = re.search(r"fuse3>=([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert depends.get(f"libfuse@{fuse_minimum}:") == "+pfs"


def test_python_build_and_run_requirements_agree():
    project = _pyproject()
    _, cmake_minimum, _, _ = _cmake()
    python_bound = re.fullmatch(r">=\s*([0-9.]+)", project["project"]["requires-python"]).group(1)
    build = [_lower_bound(r) for r in project["build-system"]["requires"]]
    run = [_lower_bound(r) for r in project["project"]["dependencies"]]
    _, depends, _, _ = _spack()
    for name, bound in [("python", python_bound), ("cmake", cmake_minimum), *build, *run]:
        assert _spack_spec(name, bound) in depends, f"Spack: depends_on({_spack_spec(name, bound)!r})"
    _, conda = _conda()
    assert f"python >={python_bound}" in conda["host"] and f"python >={python_bound}" in conda["run"]
    assert f"cmake >={cmake_minimum}" in conda["build"]
    for name, bound in build:
        assert f"{name} >={bound}" in conda["host"]
    for name, bound in run:
        assert f"{name} >={bound}" in conda["run"]
    # Nothing in run that pyproject.toml does not ask for.
    assert {re.split(r"[ >=<]", r)[0] for r in conda["run"]} == {"python"} | {n for n, _ in run}
