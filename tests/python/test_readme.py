"""Every code block of README.md and examples/README.md, run as written: a README line that drifts from
the code fails here.

Each block is found by its text and has a rule below (`RULES`, keyed by a line the block holds): run it
(Python in a fresh interpreter, shell line by line) in a work folder holding a synthetic set that
`prestage synth` made, with the placeholders the text uses (/pfs/imagenet/train, /local/ssd/stage, ...)
filled in and the obvious sizes cut (90 epochs: 2); or skip it, with the reason pytest prints (`-ra`):
blocks that need MPI ranks, a GPU, root or minutes. A block with no rule, or a rule whose block is
gone, fails: a new or changed block must say how it is checked. What the text says a block prints is
checked against what it printed (`expect`). The long examples run with PRESTAGE_README_LONG=1 (a nightly
job), and are skipped with that reason otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "examples/README.md")
BIN = Path(sys.executable).parent  # prestage, the venv's python
LONG = os.environ.get("PRESTAGE_README_LONG") == "1"
HAVE_GPU = os.path.exists("/dev/nvidia0")


@dataclasses.dataclass
class Block:
    doc: str
    line: int  # of the opening fence, from 1
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}:{self.lang or 'text'}"


def blocks(doc: str) -> List[Block]:
    out, lines = [], (ROOT / doc).read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            out.append(Block(doc, i + 1, m.group(1), "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return out


@dataclasses.dataclass
class Rule:
    """How a block is checked. skip: the reason it is not run here. needs: markers (torch, tf).
    prelude: Python run before the block (what the text defines elsewhere). subs: (old, new) pairs,
    the placeholders filled in; {work}, {data} in new are the work folder and the synthetic set.
    expect: regular expressions its output must match. commands (shell): per command as written,
    the command run ({work}, {data}, {bin} filled in) or "skip: reason"."""

    skip: Optional[str] = None
    needs: Sequence[str] = ()
    prelude: str = ""
    subs: Sequence[Tuple[str, str]] = ()
    expect: Sequence[str] = ()
    commands: Optional[Dict[str, str]] = None
    long: bool = False
    max_line: Optional[int] = None  # the longest line of output allowed (a bounded stats() print)
    after: str = ""  # Python run after the block: what the text says of its result, printed


PLACES = (("/pfs/imagenet/train", "{data}"), ("/pfs/imagenet-packed", "{work}/packed"),
          ("/local/ssd/stage", "{work}/stage"))
CATALOG = 'import prestage\ncatalog = prestage.Catalog.from_folder("{data}")\n'
SAVED = CATALOG + 'catalog.save("train.catalog")\n'
MODEL = "import torch\nmodel = torch.nn.Linear(1, 1)\n"
NO_GPU = () if HAVE_GPU else (('"cuda"', '"cpu"'),)

ARRAYS = '''
import numpy as np, h5py, tensorflow as tf, prestage
rng = np.random.default_rng(0)
os.makedirs("npy/c0", exist_ok=True)
for i in range(6):
    np.save(f"npy/c0/{i}.npy", rng.random((3, 4), dtype=np.float32))
prestage.Catalog.from_folder("npy", extensions=[".npy"]).save("train.catalog")
with h5py.File("set.h5", "w") as f:
    f["data"] = rng.random((8, 5)).astype(np.float32)
    f["labels"] = np.arange(8)
hdf5_catalog = prestage.Catalog.from_hdf5(["set.h5"], "data", labels="labels")
with tf.io.TFRecordWriter("set.tfrecord") as w:
    for i in range(8):
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(12)])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))})).SerializeToString())
tfrecord_catalog = prestage.Catalog.from_tfrecord(["set.tfrecord"], features={"image": "image", "label": "label"})
'''
DLIO = '''
import numpy as np, tensorflow as tf
H, W = 8, 6
files = ["dlio_0.tfrecord"]
with tf.io.TFRecordWriter(files[0]) as w:
    for i in range(10):
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([i]) * (H * W)])),
            "size": tf.train.Feature(int64_list=tf.train.Int64List(value=[H * W]))})).SerializeToString())
'''

SHARDS = f'''
import io, os, sys
import numpy as np, webdataset as wds
from PIL import Image
sys.path.insert(0, {str(ROOT / "tests" / "python")!r})
from conftest import write_mds
def jpeg(i):
    out = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), 3 * i, np.uint8)).save(out, format="JPEG")
    return out.getvalue()
os.makedirs("laion", exist_ok=True)
with wds.ShardWriter("laion/train-%06d.tar", maxcount=4, verbose=0) as sink:
    for i in range(12):
        sink.write({{"__key__": f"k{{i:04d}}", "jpg": jpeg(i), "cls": str(i % 3).encode()}})
write_mds(__import__("pathlib").Path("imagenet-mds"), {{"jpg": "jpeg", "cls": "int"}},
          [{{"jpg": jpeg(i), "cls": i % 3}} for i in range(10)])
'''

HF = """
import io
import datasets, numpy as np
from PIL import Image
datasets.disable_progress_bars()
def jpeg(i):
    out = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), 3 * i, np.uint8)).save(out, format="JPEG")
    return out.getvalue()
features = datasets.Features({"image": datasets.Image(),
                              "label": datasets.ClassLabel(names=["daisy", "rose"])})
flowers = datasets.Dataset.from_dict({"image": [{"bytes": jpeg(i), "path": None} for i in range(9)],
                                      "label": [i % 2 for i in range(9)]}, features=features)
flowers.save_to_disk("flowers", num_shards=2)
os.makedirs("flowers-parquet", exist_ok=True)
flowers.to_parquet("flowers-parquet/train-00000-of-00001.parquet")
"""
HAVE_HF = all(importlib.util.find_spec(m) is not None for m in ("datasets", "pyarrow"))

RULES: Dict[str, Rule] = {
    # README.md
    "scripts/dev.sh demo": Rule(skip="installs system packages (apt, as root) and builds: CI runs "
                                     "scripts/dev.sh test itself (.ci/run)"),
    'catalog = prestage.Catalog.from_folder("my-images")': Rule(
        subs=(('"my-images"', '"{data}"'),), expect=(r"\(64, 224, 224, 3\) uint8 \[",)),
    "loader = prestage.torch.Loader(catalog, batch_size=64, image_size=(224, 224))": Rule(
        needs=("torch",), prelude=CATALOG,
        expect=(r"torch\.Size\(\[64, 3, 224, 224\]\) torch\.Size\(\[64\]\)",)),
    "pip install prestage-0.1.0-": Rule(skip="needs a wheel made by scripts/wheel.sh: scripts/wheel-check.sh "
                                             "installs and checks it in CI"),
    'catalog = prestage.Catalog.from_folder("/pfs/imagenet/train")': Rule(
        subs=(("range(90)", "range(2)"),),
        # stats() lists the epoch being delivered, not every epoch planned so far: a print of it stays
        # about 2.4 KB however many epochs ran (it grew by an epoch's figures per epoch).
        expect=(r"'epochs': \[\{'epoch': 0, [^\]]*\}\]", r"'epochs': \[\{'epoch': 1, [^\]]*\}\]"),
        max_line=4000),
    'catalog = prestage.Catalog.from_webdataset("/pfs/laion/train-{000000..000123}.tar",': Rule(
        prelude=SHARDS, subs=(("/pfs/laion", "laion"), ("{000000..000123}", "{000000..000002}"),
                              ("/pfs/imagenet-mds", "imagenet-mds"), ("batch_size=256", "batch_size=4")),
        expect=(r"^12 WebDataset samples; 10 MDS samples$",)),
    'ds = datasets.load_from_disk("/pfs/flowers")  # a set saved by save_to_disk: Arrow files': Rule(
        skip=None if HAVE_HF else "needs datasets and pyarrow (the test extras)",
        prelude="import os\n" + HF,
        subs=(("/pfs/flowers", "flowers"), ("batch_size=256", "batch_size=4")),
        expect=(r"^9 Arrow rows; 9 Parquet rows; classes \['daisy', 'rose'\]$",)),
    'cat = prestage.Catalog.from_tfrecord(files, features={"data": "image", "label": "size"})': Rule(
        needs=("tf",), prelude=DLIO),
    'loader = prestage.torch.Loader("train.catalog", batch_size=64, decode="npy")': Rule(
        needs=("torch", "tf"), prelude="import os, prestage.torch, prestage.tf\n" + ARRAYS),
    "prestage pack /pfs/imagenet/train /pfs/imagenet-packed --workers 32": Rule(commands={
        "prestage pack /pfs/imagenet/train /pfs/imagenet-packed --workers 32":
            "{bin}/prestage pack {data} {work}/packed --workers 32 --quiet"}),
    'catalog = prestage.Catalog.from_shards("/pfs/imagenet-packed")': Rule(
        prelude="import prestage, subprocess\n"
                'subprocess.run(["{bin}/prestage", "pack", "{data}", "{work}/packed", "--quiet"], check=True)\n',
        ),
    "header, records = prestage.trace.read(\"run.trace\")": Rule(
        prelude=SAVED, expect=(r"\d+ reads, \d+ bytes; fields: \('sample', 'file', 'offset', 'size'",)),
    "import prestage.torch    # imports torch;": Rule(
        needs=("torch",), prelude=CATALOG + MODEL + "start = 0\n",
        subs=(("range(start, 90)", "range(start, 2)"),) + NO_GPU),
    "sampler = prestage.torch.StagedSampler(catalog, batch_size=64": Rule(
        needs=("torch",), prelude=CATALOG + "import prestage.torch\n"
                                            "def my_read(sample, label):\n    return len(sample.bytes()), label\n",
        subs=(("range(90)", "range(2)"),)),
    "dist.init_process_group(\"nccl\")": Rule(
        needs=("torch",),
        prelude="import os\nos.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='29533', RANK='0', "
                "WORLD_SIZE='1')\n" + CATALOG + MODEL,
        subs=(('"nccl"', '"gloo"'), ("range(start, 90)", "range(start, 2)"))),
    "peers=True, peer_timeout=2.0)": Rule(
        needs=("torch",),
        # Under a plain python, a world of one rank: the tier is off and says why; nothing hangs.
        prelude=CATALOG + "import prestage.torch\n",
        after='print(loader.stats()["peer_tier"], loader.stats()["peer_tier_why"])\n',
        expect=(r"False world_size 1: no other rank to fetch from",)),
    "mpirun -np 16 --map-by ppr:4:node python train.py": Rule(
        skip="needs a cluster of 4 nodes and your train.py: tests/python/test_peers.py runs the tier under "
             "mpirun on one host"),
    "prestage synth OUT --images 5000 --classes 100": Rule(commands={
        "prestage synth OUT --images 5000 --classes 100":
            "{bin}/prestage synth {work}/synth-out --images 20 --classes 4 --quiet",
        "prestage demo [SOURCE] [--stage-dir DIR]": "{bin}/prestage demo {data} --stage-dir {work}/demo-stage --quiet",
        "prestage bench --help": "{bin}/prestage bench --help",
        "prestage bench SOURCE --cache-bytes 25% --cache-only":
            "skip: minutes (an epoch per cache size and policy); tests/python/test_bench.py runs it on 30 images",
        "prestage tune SOURCE --stage-dir DIR --write tuned.json":
            "skip: minutes (a grid of 72 points); tests/python/test_bench.py runs a small grid",
        "prestage pack SRC OUT [--zstd]": "{bin}/prestage pack {data} {work}/packed-cli --zstd --quiet",
        "prestage trace run.trace": "{bin}/prestage trace {work}/cli.trace --out {work}/trace-figures",
        "prestage catalog SOURCE OUT [--json]": "{bin}/prestage catalog {data} {work}/cli.catalog --json --quiet",
        "prestage simulate --nodes 1-1024 --cache 25,50,100 --out DIR":
            "{bin}/prestage simulate --nodes 1-8 --samples 2000 --cache 25,50,100 --out {work}/simulate --quiet",
        "prestage build-mpi-plugin [--mpicxx CMD]":
            "skip: compiles against the site's MPI: tests/python/test_build_mpi_plugin.py runs it",
    }),
    # examples/README.md
    ".venv/bin/python examples/python/train_torch.py": Rule(
        needs=("torch",), long=True,
        commands={".venv/bin/python examples/python/train_torch.py":
                  "{bin}/python {root}/examples/python/train_torch.py --data {work}/examples"},
        expect=(r"epoch 1/2: loss 0\.719, accuracy 0\.781, validation accuracy 0\.677;",
                r"epoch 2/2: loss 0\.145, accuracy 0\.960, validation accuracy 0\.980;")),
    "epoch 1/2: loss 0.719, accuracy 0.781": Rule(skip="the output of train_torch.py, checked with it"),
    ".venv/bin/python examples/python/own_dataset.py": Rule(
        needs=("torch",), long=True,
        commands={".venv/bin/python examples/python/own_dataset.py":
                  "{bin}/python {root}/examples/python/own_dataset.py --data {work}/own --epochs 1"},
        expect=(r"epoch 1/1: loss [\d.]+, accuracy [\d.]+", r"the data set stays in")),
    "epoch 0: loss 2.311; PFS 17.3 MB, peers 0.0 MB": Rule(
        skip="the output of peers_ddp.py: tests/python/test_examples.py checks its peer bytes"),
    "examples/python/peers_ddp.py \\": Rule(
        skip="needs mpirun with 4 ranks and FUSE: tests/python/test_examples.py runs it (peer bytes > 0)"),
    ".venv/bin/python examples/python/train_keras.py": Rule(
        needs=("tf",), long=True,
        commands={".venv/bin/python examples/python/train_keras.py":
                  "{bin}/python {root}/examples/python/train_keras.py --data {work}/keras"},
        expect=(r"epoch 2/2: loss [\d.]+, accuracy [\d.]+, validation accuracy [\d.]+",)),
    "cmake -S . -B build/release -G Ninja": Rule(
        skip="a release build and install (minutes): scripts/dev.sh test builds and runs the C++ example"),
    "1000 samples in 10 classes, 16 batches per epoch": Rule(skip="the C++ example's output"),
}


def all_blocks() -> List[Block]:
    return [b for doc in DOCS for b in blocks(doc)]


def rule_of(block: Block) -> Tuple[Optional[str], Optional[Rule]]:
    keys = [k for k in RULES if k in block.text]
    return (keys[0], RULES[keys[0]]) if len(keys) == 1 else (None, None)


BLOCKS = all_blocks()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """A work folder with a synthetic set of 300 images in 10 classes, as `prestage synth` writes it, and
    a trace of one epoch over it (for `prestage trace`)."""
    work = tmp_path_factory.mktemp("readme")
    data = work / "data"
    subprocess.run([str(BIN / "prestage"), "synth", str(data), "--images", "300", "--classes", "10",
                    "--quiet"], check=True, timeout=300)
    subprocess.run([sys.executable, "-c",
                    "import prestage\n"
                    f"with prestage.Loader(prestage.Catalog.from_folder({str(data)!r}), 64, (32, 32),\n"
                    f"                     trace={str(work / 'cli.trace')!r}) as l:\n"
                    "    for b in l: pass\n"], check=True, timeout=120)
    return {"work": str(work), "data": str(data), "bin": str(BIN), "root": str(ROOT)}


def fill(text: str, places: Dict[str, str]) -> str:
    for key, value in places.items():
        text = text.replace("{" + key + "}", value)
    return text


def run(argv: List[str], cwd: str, timeout: int) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{out[-4000:]}"
    assert "HDF5-DIAG" not in out, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    return out


def shell_commands(text: str) -> List[str]:
    """The commands of a shell block as written: comments and comment-only lines dropped, continuation
    lines joined."""
    commands: List[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        code = re.sub(r"\s+#.*$", "", line).strip()
        if code and not code.startswith("#"):
            commands.append(re.sub(r"\s+", " ", code))
    return commands


def test_every_block_has_a_rule_and_every_rule_a_block():
    unclassified = [f"{b.id}: {b.text.splitlines()[0] if b.text else ''}" for b in BLOCKS
                    if rule_of(b)[1] is None]
    assert not unclassified, "blocks with no rule (or more than one) in tests/python/test_readme.py:\n" + \
        "\n".join(unclassified)
    used = {rule_of(b)[0] for b in BLOCKS}
    assert not set(RULES) - used, f"rules whose block is gone: {sorted(set(RULES) - used)}"
    for b in BLOCKS:
        rule = rule_of(b)[1]
        if rule is not None and rule.commands is not None:
            assert sorted(shell_commands(b.text)) == sorted(rule.commands), \
                f"{b.id}: the block's commands changed: {shell_commands(b.text)}"


def items() -> List[Tuple[Block, Optional[str]]]:
    """What is checked, one pytest case each: a block, or each command of a shell block (so that every
    command's run or skip, with its reason, is in pytest's list)."""
    out: List[Tuple[Block, Optional[str]]] = []
    for b in BLOCKS:
        rule = rule_of(b)[1]
        if rule is not None and rule.commands is not None and not rule.skip:
            out.extend((b, command) for command in shell_commands(b.text))
        else:
            out.append((b, None))
    return out


ITEMS = items()


@pytest.mark.slow
@pytest.mark.parametrize("block,command", ITEMS,
                         ids=[b.id if c is None else f"{b.id}:{c.split()[0].rsplit('/', 1)[-1]}"
                              f"{'-' + c.split()[1] if len(c.split()) > 1 else ''}" for b, c in ITEMS])
def test_block_runs_as_written(block: Block, command: Optional[str], work: Dict[str, str]) -> None:
    key, rule = rule_of(block)
    if rule is None:
        pytest.fail("no rule: see test_every_block_has_a_rule_and_every_rule_a_block")
    if rule.skip:
        pytest.skip(rule.skip)
    if rule.long and not LONG:
        pytest.skip("minutes: runs with PRESTAGE_README_LONG=1 (nightly)")
    for marker in rule.needs:
        pytest.importorskip({"torch": "torch", "tf": "tensorflow"}[marker])
    cwd = Path(work["work"]) / re.sub(r"\W", "_", block.id)
    cwd.mkdir(exist_ok=True)
    if block.lang == "python":
        code = block.text
        for old, new in rule.subs:  # this block's own: each must still be there
            assert old in code, f"{block.id}: {old!r} is no longer in the block"
            code = code.replace(old, fill(new, work))
        for old, new in PLACES:  # the places the text uses throughout
            code = code.replace(old, fill(new, work))
        out = run([sys.executable, "-c", fill(rule.prelude, work) + code + "\n" + rule.after], str(cwd),
                  timeout=300)
    else:
        assert rule.commands is not None and command is not None, f"{block.id}: a shell block needs commands"
        action = rule.commands.get(command)
        assert action is not None, f"{block.id}: {command!r} has no rule (the block changed)"
        if action.startswith("skip: "):
            pytest.skip(f"{command}: {action[6:]}")
        out = run(shlex.split(fill(action, work)), str(cwd), timeout=600)
    for pattern in rule.expect:
        assert re.search(pattern, out), f"{block.id}: expected {pattern!r} in:\n{out[-4000:]}"
    if rule.max_line is not None:
        assert max(map(len, out.splitlines())) <= rule.max_line, f"{block.id}: a line of output is longer"


def headings(path: Path) -> List[str]:
    """The titles of a Markdown file's headings, those inside code blocks left out."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.append(re.sub(r"^#+\s*", "", line))
    return out


def named_benchmark_sections(text: str) -> List[Tuple[str, str]]:
    """(file, title) for each `benchmarks/FILE.md`, "Title" in the text."""
    return re.findall(r'`?benchmarks/([\w./-]+\.md)`?, "([^"]+)"', " ".join(text.split()))


def missing_benchmark_sections(text: str) -> List[str]:
    """The named sections whose file under benchmarks/ has no heading starting with the title."""
    missing = []
    for file, title in named_benchmark_sections(text):
        path = ROOT / "benchmarks" / file
        if not path.is_file():
            missing.append(f"benchmarks/{file} (no such file)")
        elif not any(h.startswith(title) for h in headings(path)):
            missing.append(f'benchmarks/{file}, "{title}"')
    return missing


@pytest.mark.parametrize("doc", ["README.md", "RELIABILITY.md"])
def test_every_benchmark_section_a_document_names_exists(doc: str) -> None:
    """`benchmarks/FILE.md`, "Title": the section is there, in the file named (its heading starts with
    the title): the results page or a file of lab notes."""
    text = (ROOT / doc).read_text()
    assert named_benchmark_sections(text)
    missing = missing_benchmark_sections(text)
    assert not missing, f"{doc} names benchmark sections that do not exist: {missing}"


def test_a_benchmark_section_that_is_not_there_is_named() -> None:
    text = ('(`benchmarks/notes/peer-tier.md`, "The peer tier at scale") and (`benchmarks/RESULTS.md`,\n'
            '"The peer tier at scale"), (`benchmarks/notes/gone.md`, "Anything")')
    assert missing_benchmark_sections(text) == ['benchmarks/RESULTS.md, "The peer tier at scale"',
                                                "benchmarks/notes/gone.md (no such file)"]
