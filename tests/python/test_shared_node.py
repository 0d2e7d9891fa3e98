"""A stage directory on a node shared with another user (/tmp): run as two accounts, the job's (root,
as CI runs) and an unprivileged one created here, which plays the other user. Nothing the other user
plants in the shared parent is followed, believed or served, and nothing the job makes there can be
read by it."""

import errno
import os
import pickle
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import prestage
from prestage import _core
from prestage.staging import StagedSampler

OTHER = "prestage-other"
GROUP = "prestage-share"


@pytest.fixture(scope="module")
def other_user():
    """The second account (made here when running as root, as CI runs)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a second local account and run as it")
    if shutil.which("useradd") is None or shutil.which("su") is None:
        pytest.skip("no useradd/su here to make and use a second account")
    try:
        pwd.getpwnam(OTHER)
    except KeyError:
        r = subprocess.run(["useradd", "-M", OTHER], capture_output=True)
        if r.returncode != 0:
            pytest.skip("cannot make a second account: " + r.stderr.decode().strip())
    return pwd.getpwnam(OTHER)


def as_other(command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["su", OTHER, "-s", "/bin/bash", "-c", command], capture_output=True,
                          text=True, check=check)


@pytest.fixture
def shared(other_user):
    """A stage parent both users can write, as /tmp is (mode 1777)."""
    d = Path(tempfile.mkdtemp(prefix="prestage-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def data(tmp_path):
    """A small data set of raw files, and the job's catalog of it."""
    root = tmp_path / "set"
    rng = np.random.default_rng(37)
    for i in range(24):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(100, 2000))))
    return prestage.Catalog.from_folder(root, extensions=[".bin"])


@pytest.fixture
def victims(tmp_path):
    """Files of the job's user, mode 0600, outside any stage directory."""
    d = tmp_path / "mine"
    d.mkdir()
    files = {}
    for name in ("node.table", "index.log", "start.lock"):
        f = d / f"victim-{name}"
        f.write_bytes(b"the job user's own file, 37 bytes!!\n")
        f.chmod(0o600)
        files[name] = f
    return files


def one_epoch(catalog, stage_dir, **options):
    """Runs an epoch and checks that every sample's bytes are the source's."""
    with prestage.Loader(catalog, batch_size=4, decode="raw", stage_dir=stage_dir, stage_patience=None,
                         **options) as loader:
        for batch in loader:
            for k, i in enumerate(batch.indices):
                got = batch.data[batch.offsets[k]:batch.offsets[k + 1]].tobytes()
                assert got == catalog.source_path(int(i)).read_bytes()
        return loader.stats()


def assert_refused(error, area):
    assert isinstance(error, prestage.IoError) and isinstance(error, OSError)
    assert error.errno in (errno.EPERM, errno.EACCES)
    text = str(error)
    assert str(area) in text and "uid" in text and "mode" in text


def test_links_planted_in_an_area_made_first_by_another_user_are_never_followed(data, shared, victims):
    area = Path(_core.stage_area(shared, data))
    planted = " && ".join(f"ln -s {victims[name]} {area}/{name}" for name in victims)
    as_other(f"mkdir -m 0777 {area} && chmod 0777 {area} && {planted}")
    before = {name: (f.read_bytes(), f.stat().st_mtime_ns) for name, f in victims.items()}
    with pytest.raises(prestage.IoError) as refused:
        one_epoch(data, shared)
    assert_refused(refused.value, area)
    assert {name: (f.read_bytes(), f.stat().st_mtime_ns) for name, f in victims.items()} == before


def test_a_link_in_the_jobs_own_area_is_an_error_naming_it_never_followed(data, shared, victims):
    one_epoch(data, shared)
    area = Path(_core.stage_area(shared, data))
    (area / "node.table").unlink()
    (area / "node.table").symlink_to(victims["node.table"])
    before = victims["node.table"].read_bytes()
    with pytest.raises(prestage.IoError) as refused:
        one_epoch(data, shared)
    assert refused.value.errno == errno.ELOOP and "node.table" in str(refused.value)
    assert victims["node.table"].read_bytes() == before


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o777])
def test_an_area_another_user_owns_is_refused_at_construction(data, shared, mode):
    area = Path(_core.stage_area(shared, data))
    as_other(f"mkdir {area} && chmod {mode:o} {area}")
    with pytest.raises(prestage.IoError) as refused:
        prestage.Loader(data, batch_size=4, decode="raw", stage_dir=shared)
    assert_refused(refused.value, area)
    assert f"{mode:04o}" in str(refused.value)
    assert sorted(os.listdir(area)) == []  # nothing made in it


def test_an_area_of_the_jobs_user_that_others_can_write_is_refused(data, shared):
    area = Path(_core.stage_area(shared, data))
    area.mkdir()
    area.chmod(0o777)
    with pytest.raises(prestage.IoError) as refused:
        prestage.Loader(data, batch_size=4, decode="raw", stage_dir=shared)
    assert_refused(refused.value, area)


def test_a_shard_folder_another_user_owns_is_refused(data, shared, other_user):
    one_epoch(data, shared)
    area = Path(_core.stage_area(shared, data))
    shutil.rmtree(area / "07", ignore_errors=True)
    (area / "07").mkdir(mode=0o700)
    os.chown(area / "07", other_user.pw_uid, other_user.pw_gid)
    with pytest.raises(prestage.IoError) as refused:
        prestage.Loader(data, batch_size=4, decode="raw", stage_dir=shared)
    assert_refused(refused.value, area / "07")


def test_a_planted_index_and_its_copies_are_never_served(data, shared, tmp_path, other_user):
    # The other user's area holds copies of the files as they were, vouched for by its own index;
    # the files have changed since (same sizes and times: the catalog cannot tell).
    scratch = tmp_path / "scratch"
    one_epoch(data, scratch)
    made = Path(_core.stage_area(scratch, data))
    for i in range(len(data)):
        source = data.source_path(i)
        st = source.stat()
        source.write_bytes(bytes(b ^ 0xFF for b in source.read_bytes()))
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    area = Path(_core.stage_area(shared, data))
    shutil.move(made, area)
    subprocess.run(["chown", "-R", f"{OTHER}:", str(area)], check=True)
    subprocess.run(["chmod", "-R", "go+rwX", str(area)], check=True)
    with pytest.raises(prestage.IoError) as refused:
        one_epoch(data, shared)  # checks every byte against today's source
    assert_refused(refused.value, area)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_everything_made_is_the_jobs_users_alone_whatever_the_umask(data, shared, umask, other_user):
    old = os.umask(umask)
    try:
        stats = one_epoch(data, shared)
        sampler = StagedSampler(data, 4, stage_dir=shared)
        for _ in sampler:
            pass
    finally:
        os.umask(old)
    assert stats["staged_files"] == len(data)
    area = Path(_core.stage_area(shared, data))
    seen = {"dirs": 0, "files": 0}
    for path in [area, *area.rglob("*")]:
        st = path.lstat()
        assert st.st_uid == os.geteuid(), path
        if stat.S_ISDIR(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == 0o700, (path, oct(st.st_mode))
            seen["dirs"] += 1
        else:
            assert stat.S_ISREG(st.st_mode), path
            assert stat.S_IMODE(st.st_mode) == 0o600, (path, oct(st.st_mode))
            seen["files"] += 1
    assert seen["dirs"] == 257 and seen["files"] >= len(data) + 3
    assert any(p.name.startswith("catalog-") for p in area.iterdir())
    copy = _core.staged_copy_path(area, 0)
    assert as_other(f"cat {copy}", check=False).returncode != 0  # the other user reads nothing


def test_a_stage_group_shares_the_area_with_that_group_only(data, shared, other_user):
    r = subprocess.run(["groupadd", "-f", GROUP], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot make a group: " + r.stderr.decode().strip())
    import grp

    gid = grp.getgrnam(GROUP).gr_gid
    old = os.umask(0o022)
    try:
        one_epoch(data, shared, stage_group=GROUP)
    finally:
        os.umask(old)
    area = Path(_core.stage_area(shared, data))
    for path in [area, *area.rglob("*")]:
        st = path.lstat()
        assert st.st_gid == gid, path
        want = 0o2770 if stat.S_ISDIR(st.st_mode) else 0o660
        assert stat.S_IMODE(st.st_mode) == want, (path, oct(st.st_mode))
    # Without the option, the group's area is not this job's.
    with pytest.raises(prestage.IoError) as refused:
        prestage.Loader(data, batch_size=4, decode="raw", stage_dir=shared)
    assert_refused(refused.value, area)
    with pytest.raises(prestage.ConfigError):
        prestage.Loader(data, batch_size=4, decode="raw", stage_dir=shared, stage_group="no-such-group-37")


def test_a_shared_parent_like_tmp_works_and_one_without_its_sticky_bit_is_refused(data, shared):
    stats = one_epoch(data, shared)
    assert stats["staged_files"] == len(data) and not stats["stage_dir_disabled"]
    again = one_epoch(data, shared)
    assert again["epochs"][0]["hits"] == len(data)  # warm: every copy served
    open_parent = shared / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)
    with pytest.raises(prestage.IoError) as refused:
        prestage.Loader(data, batch_size=4, decode="raw", stage_dir=open_parent)
    assert refused.value.errno == errno.EPERM and str(open_parent) in str(refused.value)


def test_a_catalog_planted_in_the_area_is_never_used(data, shared, tmp_path):
    # Another user's area with a catalog of other files in it: the sampler refuses the area.
    others = tmp_path / "others"
    (others / "c0").mkdir(parents=True)
    (others / "c0" / "x.bin").write_bytes(b"not the job's data")
    area = Path(_core.stage_area(shared, data))
    as_other(f"mkdir -m 0777 {area} && chmod 0777 {area}")
    prestage.Catalog.from_folder(others, extensions=[".bin"]).save(area / "catalog.prestage")
    subprocess.run(["chown", OTHER, str(area / "catalog.prestage")], check=True)
    with pytest.raises(prestage.IoError) as refused:
        StagedSampler(data, 4, stage_dir=shared)
    assert_refused(refused.value, area)


def test_workers_use_only_the_catalog_the_sampler_was_given(data, shared, tmp_path):
    others = tmp_path / "others"
    (others / "c0").mkdir(parents=True)
    for i in range(len(data)):
        (others / "c0" / f"{i:03d}.bin").write_bytes(b"x" * 10)
    sampler = StagedSampler(data, 4, stage_dir=shared)
    try:
        where = sampler._where
        worker = pickle.loads(pickle.dumps(where))  # as a DataLoader worker gets it
        assert worker.catalog().source_path(3) == data.source_path(3)
        # A catalog of other files put in its place (by anyone who can write there) is refused.
        prestage.Catalog.from_folder(others, extensions=[".bin"]).save(where.catalog_file)
        worker = pickle.loads(pickle.dumps(where))
        with pytest.raises(prestage.IoError) as refused:
            worker.find(3)
        assert refused.value.errno == errno.EPERM
        # And a link in its place is never followed.
        os.unlink(where.catalog_file)
        os.symlink(tmp_path / "elsewhere.catalog", where.catalog_file)
        with pytest.raises(prestage.IoError) as linked:
            pickle.loads(pickle.dumps(where)).find(3)
        assert linked.value.errno == errno.ELOOP
    finally:
        os.unlink(where.catalog_file)
        sampler.close()


def test_the_io_trace_never_writes_through_a_link_or_into_another_users_file(data, shared, victims):
    # In a folder of the other user's (not sticky: the kernel's protected_symlinks does not apply).
    theirs_dir = shared / "theirs"
    as_other(f"mkdir -m 0777 {theirs_dir} && chmod 0777 {theirs_dir}")
    link = theirs_dir / "trace.bin"
    as_other(f"ln -s {victims['index.log']} {link}")
    before = victims["index.log"].read_bytes()
    with pytest.raises(prestage.IoError) as refused:
        prestage.Loader(data, batch_size=4, decode="raw", trace=link)
    assert refused.value.errno == errno.ELOOP
    assert victims["index.log"].read_bytes() == before
    theirs = theirs_dir / "theirs.bin"
    as_other(f"echo theirs > {theirs} && chmod 666 {theirs}")
    with pytest.raises(prestage.IoError) as not_mine:
        prestage.Loader(data, batch_size=4, decode="raw", trace=theirs)
    assert not_mine.value.errno == errno.EPERM
    assert theirs.read_text() == "theirs\n"
    mine = shared / "mine.bin"
    old = os.umask(0)
    try:
        with prestage.Loader(data, batch_size=4, decode="raw", trace=mine) as loader:
            for _ in loader:
                pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600 and mine.stat().st_size > 0


def test_pack_refuses_an_output_folder_another_user_made(data, shared):
    from prestage import pack as packing

    out = shared / "packed"
    as_other(f"mkdir -m 0777 {out} && chmod 0777 {out}")
    with pytest.raises(prestage.IoError) as refused:
        packing.pack(data, out, shard_bytes=20_000)
    assert refused.value.errno == errno.EPERM and str(out) in str(refused.value)
    assert os.listdir(out) == []


def test_a_file_written_by_the_cli_replaces_a_planted_link_never_follows_it(shared, victims):
    from prestage._paths import write_replacing

    target = shared / "tuned.json"
    as_other(f"ln -s {victims['node.table']} {target}")
    before = victims["node.table"].read_bytes()
    # Renamed over: the link itself is replaced (in a sticky folder only its owner or root may).
    write_replacing(target, b"{}\n")
    assert victims["node.table"].read_bytes() == before
    assert not target.is_symlink() and target.read_bytes() == b"{}\n"
