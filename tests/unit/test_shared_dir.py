"""The pytest run's shared directory (harness/pytest_plugin/session.py): removed when the run ends, also
when it is stopped before pytest_sessionfinish; one left by a killed run is removed by the next run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from harness.backends.local import process
from harness.pytest_plugin import session


def _pytest(tmp_path, conftest: str) -> tuple[subprocess.CompletedProcess, set]:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(conftest))
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "TMPDIR": str(temp)})
    return done, set(temp.glob(session.SHARED_PREFIX + "*"))


def test_a_run_stopped_while_plugins_are_configured_leaves_no_shared_directory(tmp_path):
    # A Ctrl-C that lands after our pytest_configure made the directory, before the session started
    # (so pytest_sessionfinish never runs): seen with `conformance run --backend kind` interrupted.
    done, left = _pytest(tmp_path, """
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):
            raise KeyboardInterrupt
    """)
    assert done.returncode != 0, done.stdout + done.stderr
    assert left == set(), done.stdout + done.stderr


def test_a_finished_run_leaves_no_shared_directory(tmp_path):
    done, left = _pytest(tmp_path, "")
    assert done.returncode == 0, done.stdout + done.stderr
    assert left == set()


def test_the_directory_of_a_killed_run_is_removed_by_the_next(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process.identity(dead.pid)
    dead.wait()
    killed = tmp_path / f"{session.SHARED_PREFIX}killed"
    killed.mkdir()
    (killed / session.OWNER_FILE).write_text(json.dumps(identity))
    (killed / "cluster.json").write_text("{}")
    alive = tmp_path / f"{session.SHARED_PREFIX}alive"
    alive.mkdir()
    (alive / session.OWNER_FILE).write_text(json.dumps(process.identity()))
    legacy_old, legacy_new = tmp_path / f"{session.SHARED_PREFIX}old", tmp_path / f"{session.SHARED_PREFIX}new"
    for directory in (legacy_old, legacy_new):
        directory.mkdir()
    day_ago = time.time() - session.LEGACY_AGE - 60
    os.utime(legacy_old, (day_ago, day_ago))
    assert sorted(session.remove_stale_shared_dirs(tmp_path)) == sorted([killed, legacy_old])
    assert alive.is_dir() and legacy_new.is_dir() and not killed.exists() and not legacy_old.exists()
