"""A kubeconfig's embedded keys, copied to files by the Kubernetes client, stay in the harness's own
per-process directory: never loose in TMPDIR, removed at exit, and a killed process's removed by the
next process that loads a kubeconfig."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness.core import paths
from harness.k8s import keyfiles

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
    env = {**os.environ, paths.STATE_ENV: str(tmp_path / "state"), "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": str(REPO)}
    code = ("import os, signal, sys\nfrom harness.k8s import keyfiles\n"
            f"config = keyfiles.load_configuration({str(tmp_path / 'kc')!r})\n"
            "print(config.key_file)\nsys.stdout.flush()\n" + then)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.setattr(keyfiles, "_mine", None)
    (tmp_path / "tmp").mkdir()
    _kubeconfig(tmp_path / "kc")
    return tmp_path


def test_keys_go_to_the_process_directory_and_leave_with_it(fresh):
    done = _load_in_child(fresh, "")
    assert done.returncode == 0, done.stderr
    key_file = Path(done.stdout.strip())
    assert key_file.parent.parent == fresh / "state" / keyfiles.DIRECTORY, key_file
    assert not list((fresh / "tmp").iterdir()), "a key file was written to TMPDIR"
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
    assert [p.name for p in (fresh / "state" / keyfiles.DIRECTORY).iterdir()] == [mine.name]


def test_a_live_process_keeps_its_directory(fresh):
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        theirs = fresh / "state" / keyfiles.DIRECTORY / f"{live.pid}-{psutil.Process(live.pid).create_time():.2f}"
        theirs.mkdir(parents=True)
        reused_pid = fresh / "state" / keyfiles.DIRECTORY / f"{live.pid}-12.00"  # same pid, another process
        reused_pid.mkdir()
        garbage = fresh / "state" / keyfiles.DIRECTORY / "not-a-process"
        garbage.mkdir()
        assert sorted(keyfiles.remove_stale()) == sorted([reused_pid, garbage])
        assert theirs.is_dir()
    finally:
        live.communicate(b"")
