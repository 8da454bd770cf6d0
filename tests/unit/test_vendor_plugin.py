"""The vendor's kubelet plugin as the harness runs it (harness.vendor.plugins, harness.vendor.setup) and `cluster node-paths`.

A stand-in plugin (a shell script) plays the vendor's: it "registers" by creating its socket file in
the registration directory and forks a child, so stopping must take the whole process group. The
cluster state is a recorded state.yaml; no API server is involved (the first start's wait for slices
is covered by tests/integration/test_vendor_example_driver.py).
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import psutil
import pytest
import yaml

from harness.cli import main as cli
from harness.core import paths
from harness.core.errors import ComponentError, ConfigError
from harness.vendor import file as vendor
from harness.vendor import plugins as vendor_plugin
from harness.vendor import setup as vendor_setup

NODE = {"name": "vp-real-0", "id": "abcd1234", "directory": "", "bridge": "drh0", "subnet": "10.0.0.0/24",
        "address": "10.0.0.1", "kubelet_port": 10250, "healthz_port": 10248}


@pytest.fixture
def local_state(tmp_path, monkeypatch):
    """A recorded local cluster `vp` with one real node, and one `plain` without."""
    monkeypatch.setenv(paths.STATE_ENV, str(tmp_path / "state"))
    for name, nodes in (("vp", [{**NODE, "directory": str(tmp_path / "node")}]), ("plain", [])):
        directory = tmp_path / "state" / "clusters" / name
        directory.mkdir(parents=True)
        (directory / "state.yaml").write_text(yaml.safe_dump({"name": name, "backend": "local", "realNodes": nodes}))
        (directory / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    return tmp_path / "state" / "clusters"


def _cli(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return cli.run(args, out=out), out.getvalue()


def test_node_paths_are_the_placeholders(local_state, tmp_path):
    code, text = _cli(["cluster", "node-paths", "--name", "vp", "--json"])
    assert code == 0
    rows = json.loads(text)
    assert rows == [{"nodeName": "vp-real-0", "registrationDir": f"{tmp_path}/node/kubelet/plugins_registry",
                     "pluginsDir": f"{tmp_path}/node/kubelet/plugins", "cdiDir": f"{tmp_path}/node/cdi",
                     "kubeconfig": f"{local_state}/vp/kubeconfig"}]
    assert list(rows[0]) == list(vendor.PLUGIN_PLACEHOLDERS)  # one vocabulary: the command's keys are the file's
    code, text = _cli(["cluster", "node-paths", "--name", "vp", "--node", "vp-real-0"])
    assert code == 0 and f"cdiDir:          {tmp_path}/node/cdi" in text and "nodeName:        vp-real-0" in text


def test_node_paths_refusals(local_state, capsys):
    assert _cli(["cluster", "node-paths", "--name", "vp", "--node", "other"]) == (2, "")
    assert "--node: other: not a real node of cluster 'vp' (allowed: vp-real-0)" in capsys.readouterr().err
    assert _cli(["cluster", "node-paths", "--name", "plain"]) == (2, "")
    assert "--name: plain: this cluster has no real node" in capsys.readouterr().err
    assert _cli(["cluster", "node-paths", "--name", "nosuch"])[0] == 1
    assert "no cluster named 'nosuch'" in capsys.readouterr().err


def test_a_plugin_needs_a_real_node_of_a_local_cluster(local_state, tmp_path):
    with pytest.raises(ConfigError) as caught:
        vendor_plugin.real_nodes(tmp_path / "elsewhere.kubeconfig", "v.yaml")
    assert str(caught.value.problems[0]).startswith("v.yaml: spec.kubeletPlugin: the harness starts a kubelet plugin "
                                                    "only on a real node of a local dra-harness cluster")
    with pytest.raises(ConfigError) as caught:
        vendor_plugin.real_nodes(local_state / "plain" / "kubeconfig", "v.yaml")
    assert "spec.kubeletPlugin: cluster 'plain' has no real node" in str(caught.value)
    cluster, nodes = vendor_plugin.real_nodes(local_state / "vp" / "kubeconfig", "v.yaml")
    assert cluster.name == "vp" and [n.name for n in nodes] == ["vp-real-0"]


STAND_IN = """#!/bin/sh
# a vendor plugin stand-in: registers (a socket file), forks a child that survives a plain TERM of its parent
echo "plugin for $1 starting with ACME=$ACME"
[ "$ACME" = fail ] && { echo "cannot open device"; exit 3; }
sh -c 'trap "" TERM; while :; do sleep 0.2; done' &
mkdir -p "$2"
[ "$ACME" = silent ] || : > "$2/gpu.acme.example-reg.sock"   # silent never registers (no file, not even briefly)
while :; do sleep 0.2; done
"""


def _plugin(tmp_path: Path, env: dict[str, str]) -> vendor_plugin.VendorPlugin:
    script = tmp_path / "plugin.sh"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    cluster = tmp_path / "cluster"
    cluster.mkdir(exist_ok=True)
    return vendor_plugin.VendorPlugin(cluster, "n-0", [str(script), "n-0", str(tmp_path / "reg")], env,
                                      tmp_path / "reg", ("gpu.acme.example",), cluster / "kubeconfig")


def _group(pid: int) -> list[int]:
    """Live members of process group `pid` (orphaned zombies wait for init here, and hold nothing)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def test_start_restart_and_stop_take_the_whole_group(tmp_path):
    plugin = _plugin(tmp_path, {"ACME": "ok"})
    plugin.start(timeout=20)
    try:
        first = plugin.running()
        assert first is not None and len(_group(first.pid)) >= 2  # the script and its child
        plugin.restart(kill=True, timeout=20)
        second = plugin.running()
        assert second is not None and second.pid != first.pid
        assert _group(first.pid) == []  # the crash took the child too
        assert plugin.log.read_text().count("--- dra-harness: starting ") == 2  # restarts append
        assert "starting with ACME=ok" in plugin.log.read_text()
    finally:
        assert plugin.stop() == []
    assert plugin.running() is None and _group(second.pid) == []
    assert not (plugin.cluster_dir / "pids" / f"{plugin.name}.json").exists()
    # the record a test reads back names the same process and log
    again = vendor_plugin.VendorPlugin.from_dict(json.loads(json.dumps(plugin.to_dict())))
    assert again.log == plugin.log and again.argv == plugin.argv


def test_a_plugin_that_exits_is_reported_with_its_log(tmp_path):
    plugin = _plugin(tmp_path, {"ACME": "fail"})
    with pytest.raises(ComponentError) as caught:
        plugin.start(timeout=20)
    text = str(caught.value)
    assert "vendor-plugin-n-0: exited during start (status 3)" in text and "cannot open device" in text
    assert str(plugin.log) in text and "spec.kubeletPlugin.command" in text


def test_a_plugin_that_never_registers_times_out_and_is_stopped(tmp_path):
    plugin = _plugin(tmp_path, {"ACME": "silent"})
    started = time.monotonic()
    try:
        with pytest.raises(ComponentError) as caught:
            plugin.start(timeout=1.5)
    finally:
        left = plugin.stop(kill=True)  # whatever happened, no stand-in outlives the test
    assert not left
    assert time.monotonic() - started < 15
    assert f"not ready after 2s: no a registration socket of gpu.acme.example in {tmp_path}/reg" in str(caught.value)
    assert plugin.running() is None  # nothing left behind


def test_the_suite_learns_what_the_run_set_up_from_its_arguments(tmp_path):
    """`conformance run` hands the suite its vendor set-up as pytest options (no inherited
    environment variable): the set-up flag, and the plugin record when it started plugins."""
    setup = vendor_setup.VendorSetup(vendor=None, kubeconfig=tmp_path / "kubeconfig")  # type: ignore[arg-type]
    assert setup.suite_arguments() == ["--dra-vendor-set-up"]
    setup.record = tmp_path / "vendor-plugins.json"
    assert setup.suite_arguments() == ["--dra-vendor-set-up", f"--dra-vendor-plugins={tmp_path / 'vendor-plugins.json'}"]
    assert vendor_plugin.load_plugins(None) == []  # no record: no plugin of ours to restart
