"""The ``prestage`` command as a whole: each sub-command's module is imported only when it runs, so that
one sub-command's optional dependency (Pillow, for ``synth`` and ``demo``) breaks neither the others nor
any ``--help``. Run in a fresh interpreter where Pillow cannot be imported, as on a machine without it."""

import subprocess
import sys

import pytest

COMMANDS = ["synth", "demo", "bench", "tune", "catalog", "pack", "trace", "simulate", "build-mpi-plugin"]
# Pillow made unimportable (`import PIL` raises ModuleNotFoundError), then the command's entry point.
WITHOUT_PILLOW = ("import sys; sys.modules['PIL'] = None; "
                  "from prestage.cli import main; sys.exit(main(sys.argv[1:]))")


def _prestage_without_pillow(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_PILLOW, *argv], capture_output=True, text=True,
                          timeout=120)


def test_every_command_is_listed_with_its_summary():
    from prestage.cli import summary

    r = _prestage_without_pillow("--help")
    assert r.returncode == 0, r.stderr
    listed = " ".join(r.stdout.split())  # argparse wraps the lines
    for command in COMMANDS:
        assert f"{command} {' '.join(summary(command).split())}" in listed


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_every_command_works_without_pillow(command):
    r = _prestage_without_pillow(command, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: prestage {command} ")
    assert "No module named" not in r.stderr


@pytest.mark.parametrize("argv", [["catalog", "{data}", "{out}", "--quiet"], ["pack", "{data}", "{out}"]])
def test_commands_that_need_no_pillow_run_without_it(tmp_path, argv):
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    for i in range(3):
        (data / "a" / f"{i}.jpg").write_bytes(bytes([i]) * 100)  # never decoded by these commands
    r = _prestage_without_pillow(*(a.format(data=data, out=tmp_path / "out") for a in argv))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out").exists()


def test_synth_without_pillow_says_what_to_install(tmp_path):
    r = _prestage_without_pillow("synth", str(tmp_path / "out"), "--images", "2", "--classes", "1")
    assert r.returncode == 1
    assert "PIL" in r.stderr and "pip install" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_command_is_refused():
    r = _prestage_without_pillow("nonsense")
    assert r.returncode == 2 and "invalid choice" in r.stderr
