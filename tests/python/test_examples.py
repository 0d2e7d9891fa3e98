"""The examples show what they are there to show: examples/python/peers_ddp.py, run as examples/README.md
says, fetches samples from peers (bytes > 0 after the first epoch) and says why the tier chose so."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import prestage
from prestage.bench.emulator import find_emulator, unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = shutil.which("mpirun")
PLUGIN = Path(prestage.__file__).parent / "libprestage_mpi.so"
FUSE_REASON = unavailable_reason(find_emulator())


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (install openmpi-bin)")
@pytest.mark.skipif(not PLUGIN.exists(), reason="libprestage_mpi.so not built (MPI not found)")
@pytest.mark.skipif(FUSE_REASON is not None, reason=f"cannot mount FUSE here: {FUSE_REASON}")
def test_peers_ddp_fetches_from_peers_behind_a_slow_pfs(tmp_path):
    readme = " ".join((ROOT / "examples" / "README.md").read_text().replace("\\\n", " ").split())
    (command,) = re.findall(r"mpirun [^`]*peers_ddp\.py [^`]*", readme)
    assert "--allow-run-as-root" in readme and "--slow-pfs" in command
    args = command.split("peers_ddp.py", 1)[1].split()
    # As written, with stage directories and a data folder of this test's own.
    args[args.index("--stage-dir") + 1] = str(tmp_path / "stage")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", MASTER_PORT="29547")
    done = subprocess.run([MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", "4", sys.executable,
                           str(ROOT / "examples" / "python" / "peers_ddp.py"), *args,
                           "--data", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=400, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "peer tier: on" in out, out[-4000:]
    epochs = {int(e): (float(pfs), float(peers)) for e, pfs, peers in
              re.findall(r"epoch (\d+): loss [\d.]+; PFS ([\d.]+) MB, peers ([\d.]+) MB", out)}
    assert sorted(epochs) == [0, 1], out[-4000:]
    assert epochs[0][0] > 0  # the first epoch reads the set from the PFS
    assert epochs[1][1] > 0, out[-4000:]  # then the other node's copies come from it
    assert "learned: " in out and "sent to the PFS as the faster" in out
