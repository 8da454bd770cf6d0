"""harness.binaries.manifest (cache verification) and harness.binaries.ensure/locate with a fake provider."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

import harness.binaries as binaries
from harness.binaries import ALL_BINARIES, GROUPS, KUBE_BINARIES, Versions, download, gobuild, manifest
from harness.core.errors import BinariesError, ConfigError
from harness.core.progress import Reporter

NAMES = ("kube-apiserver", "kubelet")


def write(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    path.write_bytes(data)
    return path


def flip_byte(path: Path, index: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def recorded_dir(tmp_path):
    """A directory holding two files recorded as group "kubernetes" v1.37.2."""
    write(tmp_path, "kube-apiserver", b"apiserver" * 100)
    write(tmp_path, "kubelet", b"kubelet" * 100)
    recorded = manifest.record(tmp_path, {"groups": {}}, "kubernetes", "1.37.2", NAMES, "build")
    return tmp_path, recorded


# --- manifest -----------------------------------------------------------------------------------

def test_record_then_group_ok(recorded_dir):
    directory, recorded = recorded_dir
    assert manifest.group_ok(directory, recorded, "kubernetes", "1.37.2")
    on_disk = manifest.load(directory)
    assert on_disk == recorded
    entry = on_disk["groups"]["kubernetes"]
    assert entry["version"] == "1.37.2"
    assert entry["source"] == "build"
    assert entry["files"]["kubelet"] == {"sha256": hashlib.sha256(b"kubelet" * 100).hexdigest(), "size": 700}
    assert manifest.group_ok(directory, on_disk, "kubernetes", "1.37.2")


def test_record_keeps_other_groups_and_does_not_mutate_input(recorded_dir):
    directory, recorded = recorded_dir
    before = json.loads(json.dumps(recorded))
    write(directory, "etcd", b"etcd")
    updated = manifest.record(directory, recorded, "etcd", "3.6.16", ("etcd",), "download")
    assert recorded == before
    assert set(updated["groups"]) == {"kubernetes", "etcd"}
    assert manifest.load(directory) == updated
    assert manifest.group_ok(directory, updated, "kubernetes", "1.37.2")
    assert manifest.group_ok(directory, updated, "etcd", "3.6.16")


def test_flipped_byte_fails_and_deletes_the_file(recorded_dir):
    directory, recorded = recorded_dir
    path = directory / "kubelet"
    size = path.stat().st_size
    flip_byte(path, 350)
    assert path.stat().st_size == size

    assert not manifest.group_ok(directory, recorded, "kubernetes", "1.37.2")
    assert not path.exists()  # a corrupt binary is never left where it could be used
    assert (directory / "kube-apiserver").exists()


def test_truncated_file_fails(recorded_dir):
    directory, recorded = recorded_dir
    path = directory / "kube-apiserver"
    path.write_bytes(path.read_bytes()[:-1])
    assert not manifest.group_ok(directory, recorded, "kubernetes", "1.37.2")
    assert not path.exists()


def test_missing_file_fails(recorded_dir):
    directory, recorded = recorded_dir
    (directory / "kubelet").unlink()
    assert not manifest.group_ok(directory, recorded, "kubernetes", "1.37.2")


def test_version_mismatch_fails_without_deleting(recorded_dir):
    directory, recorded = recorded_dir
    assert not manifest.group_ok(directory, recorded, "kubernetes", "1.37.3")
    assert (directory / "kubelet").exists() and (directory / "kube-apiserver").exists()


def test_unrecorded_group_fails(recorded_dir):
    directory, recorded = recorded_dir
    assert not manifest.group_ok(directory, recorded, "etcd", "3.6.16")


def test_group_with_no_files_fails(tmp_path):
    recorded = {"groups": {"kwok": {"version": "0.8.0", "files": {}}}}
    assert not manifest.group_ok(tmp_path, recorded, "kwok", "0.8.0")


def test_missing_manifest(tmp_path):
    write(tmp_path, "kubelet", b"kubelet")
    recorded = manifest.load(tmp_path)
    assert recorded == {"groups": {}}
    assert not manifest.group_ok(tmp_path, recorded, "kubernetes", "1.37.2")


@pytest.mark.parametrize("text", ["", "{not json", '{"groups": []}', '{"other": 1}', "[]", "null", "7", '"x"'])
def test_unusable_manifest_loads_as_empty(tmp_path, text):
    (tmp_path / manifest.MANIFEST).write_text(text)
    assert manifest.load(tmp_path) == {"groups": {}}


def test_sha256_file(tmp_path):
    data = os.urandom(3 << 20)  # more than one read chunk
    path = write(tmp_path, "blob", data)
    assert manifest.sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_install_file_is_whole_and_executable(tmp_path):
    src_dir, dst_dir = tmp_path / "src", tmp_path / "dst"
    src_dir.mkdir()
    dst_dir.mkdir()
    source = write(src_dir, "kubelet", b"new kubelet")
    os.chmod(source, 0o600)
    write(dst_dir, "kubelet", b"old kubelet, longer than the new one")

    manifest.install_file(source, dst_dir / "kubelet")
    assert os.listdir(dst_dir) == ["kubelet"]  # no temporary file left
    assert (dst_dir / "kubelet").read_bytes() == b"new kubelet"
    assert stat.S_IMODE((dst_dir / "kubelet").stat().st_mode) == 0o755
    assert source.read_bytes() == b"new kubelet"


def test_install_file_failure_leaves_no_temp_file(tmp_path):
    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    with pytest.raises(FileNotFoundError):
        manifest.install_file(tmp_path / "missing", dst_dir / "kubelet")
    assert os.listdir(dst_dir) == []


def test_write_atomic(tmp_path):
    target = tmp_path / "manifest.json"
    target.write_text("old")
    manifest.write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["manifest.json"]


def lock_is_free(directory: Path) -> bool:
    """Try the cache lock from a separate open file description (as another process would)."""
    with open(directory / ".lock", "a") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(other, fcntl.LOCK_UN)
        return True


def test_locked_holds_the_lock_and_can_be_taken_again(tmp_path):
    directory = tmp_path / "new" / "cache"  # created by locked()
    with manifest.locked(directory):
        assert (directory / ".lock").exists()
        assert not lock_is_free(directory)
    assert lock_is_free(directory)
    with manifest.locked(directory):  # a second, sequential use does not block
        assert not lock_is_free(directory)
    assert lock_is_free(directory)


def test_locked_released_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with manifest.locked(tmp_path):
            raise RuntimeError("provider failed")
    assert lock_is_free(tmp_path)
    with manifest.locked(tmp_path):
        pass


# --- ensure / locate with a fake provider -------------------------------------------------------

class FakeProvider:
    """Stands in for the gobuild/download modules: writes dummy executables for a group."""

    NAME = "fake"
    DESCRIPTION = "writing fake binaries"

    def __init__(self):
        self.calls: list[str] = []
        self.fail: set[str] = set()

    def provide(self, group, versions, target, reporter):
        self.calls.append(group)
        if group in self.fail:
            raise BinariesError(f"fake failure for {group}")
        for name in GROUPS[group]:
            path = target / name
            path.write_bytes(f"#!/bin/sh\necho {name} {versions.of_group(group)}\n".encode())
            os.chmod(path, 0o755)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake(cache, monkeypatch):
    provider = FakeProvider()
    picked = []

    def pick(source, group):
        picked.append((source, group))
        return provider

    monkeypatch.setattr(binaries, "_pick_source", pick)
    provider.picked = picked
    return provider


def test_ensure_provides_only_what_is_missing_or_corrupt(cache, fake):
    versions = Versions()
    first = binaries.ensure(versions, reporter=Reporter(quiet=True))
    assert fake.calls == ["kubernetes", "etcd", "kwok"]
    assert first.directory == cache / "binaries" / versions.set_id
    for name in ALL_BINARIES:
        assert first.path(name).is_file()
    assert {g: e["source"] for g, e in manifest.load(first.directory)["groups"].items()} == \
        {"kubernetes": "fake", "etcd": "fake", "kwok": "fake"}

    fake.calls.clear()
    second = binaries.ensure(versions, reporter=Reporter(quiet=True))
    assert fake.calls == []
    assert second == first

    flip_byte(first.path("kube-scheduler"), 3)
    binaries.ensure(versions, reporter=Reporter(quiet=True))
    assert fake.calls == ["kubernetes"]
    assert first.path("kube-scheduler").read_text() == f"#!/bin/sh\necho kube-scheduler {versions.kubernetes}\n"

    fake.calls.clear()
    binaries.ensure(versions, reporter=Reporter(quiet=True))
    assert fake.calls == []


def test_ensure_force_provides_everything(cache, fake):
    binaries.ensure(reporter=Reporter(quiet=True))
    fake.calls.clear()
    binaries.ensure(reporter=Reporter(quiet=True), force=True)
    assert fake.calls == ["kubernetes", "etcd", "kwok"]


def test_ensure_passes_source_to_picker(cache, fake):
    binaries.ensure(source="download", reporter=Reporter(quiet=True))
    assert fake.picked == [("download", g) for g in GROUPS]


def test_ensure_after_failed_group_resumes(cache, fake):
    fake.fail = {"etcd"}
    with pytest.raises(BinariesError, match="fake failure for etcd"):
        binaries.ensure(reporter=Reporter(quiet=True))
    assert fake.calls == ["kubernetes", "etcd"]
    recorded = manifest.load(binaries.cache_dir(Versions()))
    assert set(recorded["groups"]) == {"kubernetes"}

    fake.fail = set()
    fake.calls.clear()
    binaries.ensure(reporter=Reporter(quiet=True))
    assert fake.calls == ["etcd", "kwok"]


def test_ensure_other_versions_use_another_directory(cache, fake):
    a = binaries.ensure(Versions(), reporter=Reporter(quiet=True))
    fake.calls.clear()
    b = binaries.ensure(Versions(kubernetes="1.36.0"), reporter=Reporter(quiet=True))
    assert a.directory != b.directory
    assert fake.calls == ["kubernetes", "etcd", "kwok"]
    assert b.path("kubelet").read_text().endswith("kubelet 1.36.0\n")


def test_locate_without_install_has_hint(cache):
    with pytest.raises(BinariesError) as caught:
        binaries.locate()
    assert "binaries install" in (caught.value.hint or "")
    assert caught.value.message.startswith("binaries for kubernetes, etcd, kwok are not installed")


def test_locate_after_ensure_and_after_corruption(cache, fake):
    installed = binaries.ensure(reporter=Reporter(quiet=True))
    assert binaries.locate() == installed
    assert fake.calls == ["kubernetes", "etcd", "kwok"]  # locate provides nothing

    flip_byte(installed.path("etcd"))
    with pytest.raises(BinariesError) as caught:
        binaries.locate()
    assert caught.value.message.startswith("binaries for etcd are not installed")
    assert fake.calls == ["kubernetes", "etcd", "kwok"]


def make_user_dir(directory: Path, names=ALL_BINARIES, mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        os.chmod(path, mode)
    return directory


def test_ensure_binaries_dir_missing_names(tmp_path, fake):
    user = make_user_dir(tmp_path / "bin", [n for n in ALL_BINARIES if n not in ("kubectl", "etcd")])
    with pytest.raises(BinariesError) as caught:
        binaries.ensure(binaries_dir=user)
    message = caught.value.message
    assert "kubectl" in message and "etcd" in message
    assert "kubelet" not in message and "kwok" not in message
    assert fake.calls == []


def test_ensure_binaries_dir_that_does_not_exist(tmp_path, fake):
    with pytest.raises(BinariesError) as caught:
        binaries.ensure(binaries_dir=tmp_path / "nope")
    assert str(tmp_path / "nope") in caught.value.message


def test_ensure_binaries_dir_not_executable(tmp_path, fake):
    user = make_user_dir(tmp_path / "bin")
    os.chmod(user / "kwok", 0o644)
    with pytest.raises(BinariesError) as caught:
        binaries.ensure(binaries_dir=user)
    assert "not executable: kwok" in caught.value.message


def test_ensure_and_locate_accept_complete_binaries_dir(tmp_path, fake):
    user = make_user_dir(tmp_path / "bin")
    got = binaries.ensure(binaries_dir=str(user))
    assert got.directory == user
    assert got.path("kubelet") == user / "kubelet"
    assert binaries.locate(binaries_dir=user).directory == user
    assert fake.calls == []


def test_ensure_unknown_source(cache, fake):
    with pytest.raises(BinariesError) as caught:
        binaries.ensure(source="magic")
    assert "magic" in caught.value.message
    assert "download" in (caught.value.hint or "")
    assert fake.calls == []
    assert not cache.exists()


# --- _pick_source -------------------------------------------------------------------------------

def test_pick_source_explicit(monkeypatch):
    monkeypatch.setattr(gobuild, "go_version", lambda: (1, 26))
    assert binaries._pick_source("build", "kubernetes") is gobuild
    assert binaries._pick_source("download", "kubernetes") is download


def test_pick_source_build_without_go(monkeypatch):
    monkeypatch.setattr(gobuild, "go_version", lambda: None)
    with pytest.raises(BinariesError):
        binaries._pick_source("build", "etcd")


def test_pick_source_auto(monkeypatch):
    reachable = {"value": True}
    monkeypatch.setattr(download, "reachable", lambda group: reachable["value"])
    monkeypatch.setattr(gobuild, "go_available", lambda: True)
    assert binaries._pick_source("auto", "kubernetes") is gobuild
    monkeypatch.setattr(gobuild, "go_available", lambda: False)
    assert binaries._pick_source("auto", "kubernetes") is download
    reachable["value"] = False
    with pytest.raises(BinariesError) as caught:
        binaries._pick_source("auto", "kubernetes")
    assert "--binaries-dir" in (caught.value.hint or "")
    for name in KUBE_BINARIES:
        assert name in caught.value.hint


# --- versions and a cache that cannot take the binaries (issue 16, items 6 and 10) ---------------

@pytest.mark.parametrize("version", ["1.37.2/../../../../x", "../1.37.2", "1.37", "1.37.2.1", "", " 1.37.2",
                                     "1.37.2-", "1.37.2-rc/1", "01.37.2", "1.37.2\n", "v1.37.2"])
def test_versions_refuse_anything_but_a_plain_semantic_version(version):
    with pytest.raises(ConfigError) as caught:
        Versions(kubernetes=version)
    (problem,) = caught.value.problems
    assert (problem.source, problem.field, problem.problem) == ("--kubernetes-version", version, "not a version")
    assert "X.Y.Z" in problem.allowed


@pytest.mark.parametrize("version", ["1.37.2", "1.38.0-alpha.1", "3.6.16", "0.8.0", "1.37.0-rc.0.12-abc"])
def test_versions_accept_releases_and_pre_releases(version):
    assert Versions(kubernetes=version, etcd=version, kwok=version).kubernetes == version


def test_check_version_drops_a_leading_v_and_names_the_flag():
    assert binaries.check_version("v1.37.2", "--kubernetes-version") == "1.37.2"
    with pytest.raises(ConfigError, match=r"--etcd-version: vv3: not a version"):
        binaries.check_version("vv3", "--etcd-version")


def test_a_full_cache_during_install_is_an_error_not_a_traceback(cache, fake, monkeypatch):
    import errno

    def full(group, versions, target, reporter):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target / "kube-apiserver"))

    monkeypatch.setattr(fake, "provide", full)
    with pytest.raises(BinariesError) as caught:
        binaries.ensure(reporter=Reporter(quiet=True))
    assert "No space left on device" in caught.value.message
    assert "kube-apiserver" in caught.value.message
    assert "DRA_HARNESS_CACHE_DIR" in caught.value.hint


def test_too_little_free_space_refuses_before_providing(cache, fake, monkeypatch):
    monkeypatch.setattr(binaries.shutil, "disk_usage", lambda path: shutil_usage(free=10 << 20))
    with pytest.raises(BinariesError, match="10 MiB free, kubernetes v1.37.2 needs about 1024 MiB"):
        binaries.ensure(reporter=Reporter(quiet=True))
    assert fake.calls == []  # nothing was built or downloaded


def shutil_usage(free: int):
    import shutil

    return shutil._ntuple_diskusage(total=free * 2, used=free, free=free)


def test_a_complete_read_only_cache_is_used_without_writing(cache, fake, monkeypatch):
    import errno

    first = binaries.ensure(reporter=Reporter(quiet=True))

    def read_only(directory):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(directory / ".lock"))

    monkeypatch.setattr(manifest, "locked", read_only)
    fake.calls.clear()
    assert binaries.ensure(reporter=Reporter(quiet=True)) == first
    assert fake.calls == []
    flip_byte(first.path("etcd"), 3)  # now something must be provided: the read-only cache is reported
    with pytest.raises(BinariesError, match="Read-only file system"):
        binaries.ensure(reporter=Reporter(quiet=True))
