"""The kind backend's test plugins as pods (harness.backends.kind.node_plugins): the pod and RoleBinding they are
made of, and the node lock they share with the local backend's plugins. Run end to end on kind by the suite
(`conformance run --backend kind`: test_kubelet_node.py, test_kubelet_restart_and_upgrade.py, ...)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import PurePosixPath

import pytest

from harness.backends.kind import node_plugins
from harness.backends.local.realnode.sharing import NodeUse
from harness.backends.manifests import NAMESPACE, PLUGIN

DRIVER = "gpu.fd0-abcde-gw0-123456.example.com"


def test_the_plugin_pod_runs_on_its_node_with_the_kubelets_directories():
    pod = node_plugins.plugin_pod("c-worker2", DRIVER, "localhost/dra-harness/fake-driver:0.1.0", "fd0", "t-1")
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == NAMESPACE and spec["serviceAccountName"] == PLUGIN
    assert spec["nodeName"] == "c-worker2" and spec["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"][node_plugins.PLUGIN_LABEL] == "c-worker2"
    (container,) = spec["containers"]
    assert f"--driver={DRIVER}" in container["args"] and "--node=c-worker2" in container["args"]
    assert "--instance=fd0" in container["args"] and "--namespace=t-1" in container["args"]
    # the checkpoint is per driver on the node, so an upgrade's second instance shares it with the first
    assert f"--state-dir={node_plugins.STATE_ROOT / DRIVER}" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for name in ("plugins-registry", "plugins", "cdi", "pod-resources"):
        assert mounts[name] == hosts[name], name  # the node's own paths, where the kubelet looks
    assert hosts["plugins-registry"] == "/var/lib/kubelet/plugins_registry" and hosts["cdi"] == "/var/run/cdi"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_an_upgrade_instance_gets_its_own_pod_and_socket_names():
    first = node_plugins.plugin_pod("n", DRIVER, "img", None, None)
    second = node_plugins.plugin_pod("n", DRIVER, "img", None, None, rolling_update_id="new")
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert "--rolling-update-id=new" in second["spec"]["containers"][0]["args"]
    assert not any(a.startswith(("--rolling-update-id", "--instance", "--namespace"))
                   for a in first["spec"]["containers"][0]["args"])


@pytest.mark.parametrize("driver", [DRIVER, "a" * 200 + ".example.com", "storage.x", "example/gpu", "Foo_Bar"])
def test_pod_names_are_dns_labels_and_differ_per_node_and_driver(driver):
    name = node_plugins.pod_name("c-worker", driver, None)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name), name
    assert name != node_plugins.pod_name("c-worker2", driver, None) != node_plugins.pod_name("c-worker", driver, "x")


def test_the_faults_binding_lets_the_plugins_account_read_the_tests_configmaps():
    binding = node_plugins.faults_binding("t-1")
    assert binding["metadata"]["namespace"] == "t-1" and binding["roleRef"]["name"] == "view"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PLUGIN, "namespace": NAMESPACE}]


def test_the_wrapper_passes_sigterm_on_and_ends_with_the_plugins_status(tmp_path):
    """The shell around the plugin (so that a SIGKILL to the plugin is possible): its exit status is the plugin's,
    and the plugin's PID is where `stop(kill=True)` reads it. Run with `sleep`/`exit` standing in for Python."""
    script = node_plugins.WRAPPER.replace("python -m \"$PLUGIN_MODULE\" \"$@\"", "sh -c 'exit 3'")
    assert script != node_plugins.WRAPPER
    script = script.replace("/run/plugin/pid", str(tmp_path / "pid"))
    done = subprocess.run(["sh", "-c", script, "plugin"], capture_output=True, timeout=30)
    assert done.returncode == 3 and (tmp_path / "pid").read_text().strip().isdigit()


def test_a_node_use_by_name_locks_in_the_given_directory(tmp_path):
    user, restarter = NodeUse(name="c-worker", lock_dir=tmp_path), NodeUse(name="c-worker", lock_dir=tmp_path)
    user.share()
    restarter.will_disrupt()
    with pytest.raises(Exception, match="c-worker"):  # the other user holds its share: no restart meanwhile
        with restarter.alone(wait=0.5):
            pass
    user.release()
    with restarter.alone(wait=5):
        assert (tmp_path / "users.lock").exists()
    restarter.release()


def test_a_node_use_needs_a_record_or_a_name_and_a_directory():
    with pytest.raises(AssertionError):
        NodeUse(name="c-worker")


def test_a_device_plugin_pod_registers_through_the_plugin_watcher_and_journals_on_the_node():
    pod = node_plugins.device_plugin_pod("c-worker2", "example.com/gpu", "tiny", "img", pre_start_required=True)
    (container,) = pod["spec"]["containers"]
    assert {"name": "PLUGIN_MODULE", "value": "fake_devices.deviceplugin"} in container["env"]
    args = container["args"]
    assert "--resource=example.com/gpu" in args and "--profile=tiny" in args and "--pre-start-required" in args
    assert "--registry-dir=/var/lib/kubelet/plugins_registry" in args
    assert f"--state-dir={node_plugins.device_plugin_state('example.com/gpu')}" in args
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", pod["metadata"]["name"])
    assert pod["metadata"]["name"] != node_plugins.plugin_pod("c-worker2", "example.com/gpu", "img", None, None)[
        "metadata"]["name"]
    assert "--pre-start-required" not in node_plugins.device_plugin_pod("n", "r.io/x", "tiny", "img")["spec"][
        "containers"][0]["args"]


def test_the_tests_plugins_go_to_a_worker_without_the_deployed_drivers_devices():
    from fake_devices.config import PROFILE_LABEL
    from harness.backends.kind.backend import plugin_node

    workers = ["c-worker", "c-worker2", "c-worker3"]
    labels = {"c-worker": {PROFILE_LABEL: "dgx-h100"}, "c-worker2": {}, "c-worker3": {PROFILE_LABEL: "a100-mig"}}
    assert plugin_node(workers, labels) == "c-worker2"
    assert plugin_node(workers, {n: {PROFILE_LABEL: "p"} for n in workers}) == "c-worker3"  # all have devices
    assert plugin_node(["c-worker", "c-gone"], {"c-worker": {PROFILE_LABEL: "p"}}) == "c-gone"  # unlisted: as profiled


def test_a_node_directory_is_read_through_the_engine_as_the_suite_reads_a_path(tmp_path):
    """NodeDir: a kind node's CDI directory for the vendor-mode checks. A stand-in `docker` runs `exec NODE CMD...`
    here, so the listing and reading run over a real directory."""
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\n[ "$1" = exec ] || exit 9\nshift 2\nexec "$@"\n')
    docker.chmod(0o755)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "gpu.example.com-uid1.json").write_text('{"kind": "example.com/gpu"}')
    (cdi / "notes.yaml").write_text("kind: x\n")
    (cdi / "sub").mkdir()
    directory = node_plugins.NodeDir("c-worker", PurePosixPath(cdi), [str(docker)], None)
    assert directory.is_dir() and str(directory) == f"c-worker:{cdi}"
    entries = directory.iterdir()
    assert [(e.name, e.is_file(), e.suffix) for e in entries] == [
        ("gpu.example.com-uid1.json", True, ".json"), ("notes.yaml", True, ".yaml"), ("sub", False, "")]
    assert entries[0].read_text(errors="replace") == '{"kind": "example.com/gpu"}'
    (cdi / "notes.yaml").unlink()
    assert entries[0].exists() and not entries[1].exists()  # looked at now, not when listed
    with pytest.raises(FileNotFoundError, match="c-worker"):
        directory.read("gone.json")
    missing = node_plugins.NodeDir("c-worker", PurePosixPath(tmp_path / "none"), [str(docker)], None)
    assert not missing.is_dir() and missing.iterdir() == []


def test_the_wrapper_passes_sigterm_to_the_plugin(tmp_path):
    script = node_plugins.WRAPPER.replace("python -m \"$PLUGIN_MODULE\" \"$@\"", "sleep 30")
    script = script.replace("/run/plugin/pid", str(tmp_path / "pid"))
    wrapper = subprocess.Popen(["sh", "-c", script, "plugin"])
    try:
        deadline = 100
        while not (tmp_path / "pid").exists() and deadline:  # the child started (bounded: 100 x 0.05 s)
            deadline -= 1
            subprocess.run(["sleep", "0.05"])
        wrapper.terminate()
        assert wrapper.wait(timeout=10) == 143  # the plugin's status: ended by SIGTERM, not left behind
    finally:
        wrapper.kill()
    child = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
