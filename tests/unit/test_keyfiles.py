"""A kubeconfig's embedded keys, copied to files by the Kubernetes client, stay in a directory of the
process's own: never loose in TMPDIR, removed at exit, and a killed process's removed by the next
process that loads a kubeconfig."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fake_devices import keyfiles

REPO = Path(__file__).resolve().parents[2]
KEY = "-----BEGIN PRIVATE KEY-----\nnot really a key\n-----END PRIVATE KEY-----\n"


def _kubeconfig(path: Path) -> Path:
    data = base64.b64encode(KEY.encode()).decode()
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                    "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', certificate-authority-data: "
                    f"{data}}}}}]\nusers: [{{name: u, user: {{client-certificate-data: {data}, client-key-data: {data}}}}}]\n"
                    "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    return path


def _load_in_child(tmp_path: Path, then: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)}
    code = ("import os, signal, sys\nfrom fake_devices import keyfiles\n"
            f"config = keyfiles.load_configuration({str(tmp_path / 'kc')!r})\n"
            "print(config.key_file)\nsys.stdout.flush()\n" + then)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(keyfiles, "_mine", None)
    _kubeconfig(tmp_path / "kc")
    return tmp_path


def test_keys_go_to_the_process_directory_and_leave_with_it(fresh):
    done = _load_in_child(fresh, "")
    assert done.returncode == 0, done.stderr
    key_file = Path(done.stdout.strip())
    assert key_file.parent.parent == fresh / "tmp" / f"{keyfiles.PREFIX}{os.getuid()}", key_file
    assert [p.name for p in (fresh / "tmp").iterdir()] == [key_file.parent.parent.name], "a key file loose in TMPDIR"
    assert not key_file.parent.exists(), "the process's key directory outlived it"


def test_a_killed_process_leaves_its_keys_until_the_next_process_removes_them(fresh):
    killed = _load_in_child(fresh, "os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -signal.SIGKILL
    left = Path(killed.stdout.strip())
    assert left.read_text() == KEY  # what the kill leaves: the reason for this module

    config = keyfiles.load_configuration(fresh / "kc")
    assert not left.parent.exists(), "a dead process's key directory was not removed"
    mine = Path(config.key_file).parent
    assert mine == keyfiles.directory() and mine.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in keyfiles.root().iterdir()] == [mine.name]


def test_a_live_process_keeps_its_directory(fresh):
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        theirs = keyfiles.root() / f"{live.pid}-{keyfiles.started(live.pid)}"
        theirs.mkdir(parents=True)
        reused_pid = keyfiles.root() / f"{live.pid}-12"  # same pid, another process
        reused_pid.mkdir()
        garbage = keyfiles.root() / "not-a-process"
        garbage.mkdir()
        assert sorted(keyfiles.remove_stale()) == sorted([reused_pid, garbage])
        assert theirs.is_dir()
    finally:
        live.communicate(b"")


def test_the_fake_drivers_processes_use_it_too(fresh):
    """fake_devices.kube.api_client (driver, kubelet plugin, health monitor), killed: nothing loose in TMPDIR."""
    env = {**os.environ, "TMPDIR": str(fresh / "tmp"), "PYTHONPATH": str(REPO)}
    code = ("import os, signal\nfrom fake_devices import kube\n"
            f"print(kube.api_client({str(fresh / 'kc')!r}).configuration.key_file, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert Path(killed.stdout.strip()).parent.parent == keyfiles.root()
    assert [p.name for p in (fresh / "tmp").iterdir()] == [keyfiles.root().name]
