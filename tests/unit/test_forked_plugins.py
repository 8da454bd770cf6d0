"""harness.backends.local.realnode.forked: a kubelet plugin forked from a server that imported it once is what
process.start would have made (session, directory, stdio, pid file, command line), and a stop ends it."""

import json
import os
import subprocess
import sys

import psutil
import pytest

from harness.backends.local import process
from harness.backends.local.realnode import forked
from harness.k8s import wait


@pytest.fixture
def cluster_dir(tmp_path):
    yield tmp_path
    for running in process.recorded(tmp_path).values():
        if process.alive(running):
            process.terminate([psutil.Process(running.pid)], 5.0)


def _plugin_argv(cluster_dir, *flags):
    return [sys.executable, "-m", forked.PLUGIN_MODULE, f"--kubeconfig={cluster_dir}/kubeconfig", *flags]


def test_a_forked_plugin_is_recorded_like_a_started_process_and_writes_its_log(cluster_dir):
    # --help: the plugin's own argument parser answers and the fork ends with 0
    running = forked.start("plugin-help", _plugin_argv(cluster_dir, "--help"), cluster_dir)
    wait.until("the forked plugin to end", lambda: not process.alive(running), 30)
    log = (cluster_dir / "logs" / "plugin-help.log").read_text()
    assert "--driver" in log and "--plugins-dir" in log, log
    recorded = json.loads((cluster_dir / "pids" / "plugin-help.json").read_text())
    assert recorded["pid"] == running.pid and recorded["argv"][2] == forked.PLUGIN_MODULE


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_a_forked_plugin_runs_in_its_own_session_and_directory_with_its_command_line(cluster_dir):
    (cluster_dir / "kubeconfig").write_text(KUBECONFIG)  # no API server behind it: the plugin keeps retrying
    argv = _plugin_argv(cluster_dir, "--driver=x.example.com", "--node=n", f"--plugins-dir={cluster_dir}/p",
                        f"--registry-dir={cluster_dir}/r", f"--cdi-dir={cluster_dir}/c", f"--state-dir={cluster_dir}/s")
    running = forked.start("plugin-x", argv, cluster_dir)
    proc = psutil.Process(running.pid)
    # the command line is set last of all the fork does before it runs the plugin
    wait.until("the fork to become the plugin", lambda: " ".join(proc.cmdline()) == " ".join(argv), 30)
    assert os.getsid(running.pid) == running.pid, "not the leader of its own session"
    assert proc.cwd() == str(cluster_dir)
    assert os.readlink(f"/proc/{running.pid}/fd/0") == os.devnull
    # cluster down's sweep finds it by the cluster directory in its command line
    assert running.pid in {p.pid for p in process.processes_of(cluster_dir)}
    wait.until("the plugin's first log lines", lambda: "Connection refused" in running.log.read_text(), 30)
    assert process.terminate([proc], 5.0) == []  # SIGTERM ends it, and the server reaped it (no zombie left)
    assert not process.alive(running)


def test_plugins_fork_from_one_server_per_harness_process(cluster_dir):
    first = forked.start("one", _plugin_argv(cluster_dir, "--help"), cluster_dir)
    second = forked.start("two", _plugin_argv(cluster_dir, "--help"), cluster_dir)
    server = forked._server
    assert server is not None and server.poll() is None
    for running in (first, second):
        wait.until("the forked plugin to end", lambda r=running: not process.alive(r), 30)
    assert forked._server is server


def test_a_dead_server_is_replaced(cluster_dir):
    forked.start("before", _plugin_argv(cluster_dir, "--help"), cluster_dir)
    old = forked._server
    assert old is not None
    old.kill()
    old.wait()
    running = forked.start("after", _plugin_argv(cluster_dir, "--help"), cluster_dir)
    wait.until("the forked plugin to end", lambda: not process.alive(running), 30)
    assert forked._server is not old and "--driver" in (cluster_dir / "logs" / "after.log").read_text()


def test_only_a_kubelet_plugins_argv_is_forked(cluster_dir):
    with pytest.raises(AssertionError, match="not a kubelet plugin"):
        forked.start("other", [sys.executable, "-m", "fake_devices.deviceplugin"], cluster_dir)


def test_a_server_that_does_not_answer_is_replaced(cluster_dir, monkeypatch):
    silent = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    monkeypatch.setattr(forked, "_server", silent)
    monkeypatch.setattr(forked, "ANSWER_TIMEOUT", 0.5)
    running = forked.start("after-silence", _plugin_argv(cluster_dir, "--help"), cluster_dir)
    wait.until("the forked plugin to end", lambda: not process.alive(running), 30)
    assert silent.poll() is not None, "the silent server was left running"
    assert forked._server is not silent and "--driver" in running.log.read_text()
