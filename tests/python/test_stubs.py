"""The typing surface: the extension module's stubs name everything it has, the package is marked typed
and both are installed, mypy's stubtest (where mypy is installed) finds no stub that disagrees, and mypy
finds no error in the package."""

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import prestage
import prestage._core as core

PACKAGE = Path(prestage.__file__).parent
STUB = PACKAGE / "_core.pyi"


def public(names):
    return {n for n in names if not n.startswith("_")}


def stub_names():
    """{top-level name: set of public names defined in its class body (empty for others)}."""
    tree = ast.parse(STUB.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            out[node.name] = members
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = set()
    return out


def test_stubs_and_py_typed_are_installed_with_the_package():
    assert STUB.is_file()
    assert (PACKAGE / "py.typed").is_file()


def test_stubs_name_every_public_name_of_the_extension_module():
    stubs = stub_names()
    assert public(dir(core)) == public(stubs)
    for name in public(dir(core)):
        runtime = getattr(core, name)
        if not inspect.isclass(runtime):
            continue
        stubbed = public(stubs[name])
        if hasattr(runtime, "__members__"):  # a pybind11 enum: its members and _Enum's machinery
            assert public(runtime.__members__) - {"raise"} == stubbed, name  # `raise`: a keyword
            continue
        assert public(vars(runtime)) == stubbed, name
    assert public(dir(core.transforms)) == public(stubs["_Transforms"])


def test_stubtest_finds_no_disagreement(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("needs mypy")
    allow = tmp_path / "allow.txt"
    # pybind11 signatures carry no default values stubtest can compare, and the enums' machinery is
    # pybind11's.
    # The metaclass of every class is pybind11's; Batch and Catalog have no constructor (pybind11's
    # stand-in takes *args and raises); `raise`, a keyword, cannot be named in a stub.
    allow.write_text("\n".join([
        r"prestage\._core\.[A-Z][A-Za-z]*",
        r"prestage\._core\.(Batch|Catalog)\.__init__",
        r"prestage\._core\.OnError\.raise",
    ]) + "\n")
    done = subprocess.run([sys.executable, "-m", "mypy.stubtest", "prestage._core", "--allowlist", str(allow),
                           "--ignore-unused-allowlist"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_type_checkers_see_every_option_of_the_loader(tmp_path):
    """The options are typed once (prestage.options), and a checker reads them through **options."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("needs mypy")
    user = tmp_path / "user.py"
    user.write_text(
        "import prestage\n"
        "cat = prestage.Catalog.from_folder('data')\n"
        "ok = prestage.Loader(cat, 4, (8, 8), readers=2, layout='NCHW', stage_dir=None, tuned='t.json')\n"
        "size: 'tuple[int, int] | None' = ok.image_size\n"
        "bad = prestage.Loader(cat, 4, readerz=2)\n"
        "worse = prestage.Loader(cat, 4, layout='CHW')\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir",
                           str(tmp_path / "cache"), str(user)], capture_output=True, text=True, cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in lines] == ["5", "6"], done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_finds_no_error_in_the_package(tmp_path):
    """mypy as the project runs it (pyproject.toml's [tool.mypy]: the package, with the optional
    dependencies that have no type information ignored) finds nothing to report."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("needs mypy")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                           "python/prestage"], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
