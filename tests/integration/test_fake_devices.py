"""The fake driver against the real 1.37 apiserver and scheduler: what it publishes is accepted,
allocated with the right geometry, reacts to faults, and survives restarts without a gap."""

from __future__ import annotations

import pytest

from conformance import objects
from fake_devices import faults, profile, render
from fake_devices.controller import INSTANCE_LABEL, FakeDriver, PublishError
from fake_devices.plan import content
from harness.k8s import wait
from harness.k8s.client import Clients

pytestmark = pytest.mark.integration


def _published(k8s: Clients, driver: FakeDriver) -> dict[str, dict]:
    items = k8s.resource.list_resource_slice(label_selector=f"{INSTANCE_LABEL}={driver.config.instance}").items
    return {i.metadata.name: k8s.api_client.sanitize_for_serialization(i) for i in items}


@pytest.mark.parametrize("profile_name", profile.builtin_names())
def test_every_builtin_profile_is_accepted_and_published_as_rendered(k8s, fake_driver, simulated_node, profile_name):
    driver = fake_driver({simulated_node: profile_name})
    published = _published(k8s, driver)
    expected = render.render_node(profile.load(profile_name), simulated_node, driver.drivers,
                                  node_uid=k8s.core.read_node(simulated_node).metadata.uid,
                                  instance=driver.config.instance)
    expected_by_name = {s["metadata"]["name"]: s for slices in expected.values() for s in slices}
    assert set(published) == set(expected_by_name)
    for name, slice_obj in published.items():
        assert content(slice_obj) == content(expected_by_name[name]), name
        assert slice_obj["spec"]["pool"]["generation"] == 1


def _device_taints(k8s: Clients, driver: FakeDriver, device: str):
    for slice_obj in _published(k8s, driver).values():
        for dev in slice_obj["spec"].get("devices") or []:
            if dev["name"] == device:
                return [(t["key"], t.get("value"), t["effect"]) for t in dev.get("taints") or []]
    return None  # not published


def test_faults_become_taints_and_recovery_clears_them(k8s, fake_driver, simulated_node, dra_namespace):
    driver = fake_driver({simulated_node: "tiny"})
    cm = driver.config.faults_configmap
    for kind, effect in (("warning", "None"), ("degraded", "NoSchedule"), ("unhealthy", "NoExecute")):
        faults.set_fault(k8s.core, dra_namespace, cm, simulated_node, "gpu-1", kind)
        wait.until(f"gpu-1 tainted {effect}", lambda: _device_taints(k8s, driver, "gpu-1") ==
                   [(render.FAULT_TAINT_KEY, kind, effect)], 10)
        assert _device_taints(k8s, driver, "gpu-0") == []  # only the faulty device
    faults.set_fault(k8s.core, dra_namespace, cm, simulated_node, "gpu-1", "lost")
    wait.until("gpu-1 gone from its slice", lambda: _device_taints(k8s, driver, "gpu-1") is None, 10)
    faults.set_fault(k8s.core, dra_namespace, cm, simulated_node, "gpu-1", None)
    wait.until("gpu-1 back and healthy", lambda: _device_taints(k8s, driver, "gpu-1") == [], 10)
    generations = {s["spec"]["pool"]["generation"] for s in _published(k8s, driver).values()
                   if s["spec"]["driver"] == driver.drivers.gpu}
    assert generations == {6}  # generation 1, then one per change: 3 taints, lost, recovered


def test_a_fault_written_between_the_drivers_list_and_its_watch_is_published(k8s, fake_driver, simulated_node,
                                                                           dra_namespace, monkeypatch):
    """The driver lists its sources, then starts their watches: a fault set in between (a loaded machine,
    a test injecting right after start) must still become a taint. CI once lost such a fault: the watch
    listed again on its own and dropped what that list held, so the taint never came."""
    first = fake_driver({simulated_node: "tiny"})
    first.stop(delete_slices=True)
    spawn = FakeDriver._spawn

    def fault_before_the_watch(self, target, name):
        if name == "watch-faults":
            faults.set_fault(k8s.core, dra_namespace, self.config.faults_configmap, simulated_node, "gpu-0", "degraded")
        spawn(self, target, name)

    monkeypatch.setattr(FakeDriver, "_spawn", fault_before_the_watch)
    driver = FakeDriver(first.config, k8s.api_client).start()
    try:
        wait.until("gpu-0 tainted NoSchedule", lambda: _device_taints(k8s, driver, "gpu-0") ==
                   [(render.FAULT_TAINT_KEY, "degraded", "NoSchedule")], 30,
                   diagnostics=lambda: f"taints now: {_device_taints(k8s, driver, 'gpu-0')}, errors: {driver.errors}")
    finally:
        driver.stop(delete_slices=True)


def test_restarted_driver_rewrites_nothing(k8s, fake_driver, simulated_node):
    first = fake_driver({simulated_node: "a100-mig"})
    before = {n: s["metadata"]["resourceVersion"] for n, s in _published(k8s, first).items()}
    first.stop()  # as if the process died: its slices stay
    second = FakeDriver(first.config, k8s.api_client).start()
    try:
        assert second.wait_idle(60) and not second.errors
        after = {n: s["metadata"]["resourceVersion"] for n, s in _published(k8s, second).items()}
    finally:
        second.stop()
    assert after == before  # same slices, not one write: no moment without devices


def test_profile_change_bumps_the_pool_generation(k8s, fake_driver, simulated_node):
    first = fake_driver({simulated_node: "tiny"})
    first.stop()
    config = first.config.__class__(**{**first.config.__dict__, "nodes": {simulated_node: "dgx-h100"},
                                       "profiles": {"dgx-h100": profile.load("dgx-h100")}})
    second = FakeDriver(config, k8s.api_client).start()
    try:
        assert second.wait_idle(60) and not second.errors
        gpu = [s for s in _published(k8s, second).values() if s["spec"]["driver"] == second.drivers.gpu]
        assert [s["spec"]["pool"]["generation"] for s in gpu] == [2]
        assert len(gpu[0]["spec"]["devices"]) == 8
    finally:
        second.stop(delete_slices=True)


def test_deleted_node_loses_its_slices(k8s, fake_driver, unique_name):
    from harness.backends.kwok import nodes
    from harness.core.progress import Reporter

    name = unique_name("gone")
    nodes.create(k8s.core, [nodes.NodeSpec(name, labels={"dra-harness.x-k8s.io/ephemeral": "true"})],
                 Reporter(quiet=True))
    try:
        driver = fake_driver({name: "tiny"})
        assert len(_published(k8s, driver)) == 3
    finally:
        k8s.core.delete_node(name)
    wait.until(f"slices of deleted node {name} to go", lambda: not _published(k8s, driver), 30)


def test_slices_the_api_server_refuses_fail_publishing_with_slice_field_and_message(k8s, simulated_node, dra_namespace,
                                                                                   unique_name):
    """A 422 is not retried silently forever: publish() names the slice, the field and the server's message
    (python -m fake_devices then exits non-zero instead of printing `ready`, so `cluster up` fails)."""
    from fake_devices import config as driver_config

    instance = unique_name("fdr")
    config = driver_config.build(instance, f"{instance}.example.com", [], nodes={simulated_node: "tiny"},
                                 namespace=dra_namespace, workers=2, variant="refused-by-api")
    driver, text = _publish_error(k8s, config)
    # the variant breaks the first device of every driver: whichever slice the driver wrote first is named
    named = [(d, render.slice_name(simulated_node, d, 0)) for d in driver.drivers.all()
             if f"ResourceSlice {render.slice_name(simulated_node, d, 0)} (node {simulated_node}, driver {d})" in text]
    assert len(named) == 1, text
    assert "refused by the API server (422 Unprocessable Entity) at spec.devices[0].name: " in text, text
    assert f'"{named[0][1]}" is invalid: spec.devices[0].name: Invalid value: "' in text, text


def test_fault_inject_refuses_devices_and_nodes_that_do_not_exist(k8s, dra_cluster, fake_driver, simulated_node,
                                                                    dra_namespace, capsys):
    import io

    from harness.cli import main as cli

    driver = fake_driver({simulated_node: "tiny"})
    cm = driver.config.faults_configmap

    def inject(node: str, device: str, kind: str = "warning") -> tuple[int, str]:
        code = cli.run(["fault", "inject", "--kubeconfig", str(dra_cluster.kubeconfig), "--instance",
                        driver.config.instance, "--namespace", dra_namespace, "--kind", kind, "--node", node,
                        "--device", device], out=io.StringIO())
        return code, capsys.readouterr().err

    code, err = inject(simulated_node, "gpu-99")
    assert code == 2 and f"--device: gpu-99: node {simulated_node} has no such device (allowed: gpu-0, gpu-1" in err, err
    code, err = inject("no-such-node", "gpu-0")
    assert code == 2, err
    assert f"has no devices of fake-driver instance {driver.config.instance} (allowed: {simulated_node}" in err, err
    # refused before anything changed: no fault ConfigMap was written
    assert not [c for c in k8s.core.list_namespaced_config_map(dra_namespace).items if c.metadata.name == cm]

    assert inject(simulated_node, "gpu-1", "lost")[0] == 0
    wait.until("gpu-1 gone from its slice", lambda: _device_taints(k8s, driver, "gpu-1") is None, 10)
    # a lost device is not in any slice, but its fault can still be changed
    assert inject(simulated_node, "gpu-1")[0] == 0


def test_driver_process_exits_3_instead_of_ready_when_a_slice_is_refused(k8s, dra_cluster, simulated_node,
                                                                       dra_namespace, unique_name, tmp_path):
    """`python -m fake_devices` as `cluster up` runs it: no `ready` line, exit status 3, the refusal on stderr
    (the backend then fails with "fake-devices: exited during start with code 3" and these lines)."""
    import subprocess
    import sys

    from fake_devices import config as driver_config

    instance = unique_name("fdp")
    config = driver_config.build(instance, f"{instance}.example.com", ["tiny"], nodes={simulated_node: "tiny"},
                                 namespace=dra_namespace)
    (tmp_path / "driver.yaml").write_text(driver_config.to_yaml(config))
    # the refused-by-api variant is not part of the config file format (self-tests only): patch it in
    code = ("import dataclasses, sys\n"
            "from fake_devices import config, __main__ as main\n"
            "load = config.load\n"
            "config.load = lambda path: dataclasses.replace(load(path), variant='refused-by-api')\n"
            "main.driver_config = config\n"
            f"sys.exit(main.main(['--config', {str(tmp_path / 'driver.yaml')!r}, '--kubeconfig', "
            f"{str(dra_cluster.kubeconfig)!r}, '--delete-on-exit', '--publish-timeout', '60']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "ready" not in result.stdout
    assert f"error: could not publish the devices of instance {instance}:" in result.stderr
    assert f"(node {simulated_node}, driver " in result.stderr and "at spec.devices[0].name: " in result.stderr
    assert not k8s.resource.list_resource_slice(
        label_selector=f"{INSTANCE_LABEL}={instance}").items  # --delete-on-exit left nothing behind


def test_a_node_allocatable_profile_on_a_node_without_the_feature_is_refused_naming_node_and_feature(
        k8s, simulated_node, dra_namespace, unique_name, tmp_path):
    """Admission refuses a slice with nodeAllocatableResources for a node whose status.declaredFeatures lacks
    DRANodeAllocatableResources (a simulated node declares nothing): publishing fails naming the slice, the
    node and the server's reason, instead of retrying in silence (docs/fake-devices.md)."""
    from fake_devices import config as driver_config

    if "DRANodeAllocatableResources" in (k8s.core.read_node(simulated_node).status.declared_features or []):
        pytest.skip(f"node {simulated_node} declares DRANodeAllocatableResources")
    path = objects.node_profile(tmp_path, "host-memory", """  gpus:
  - {model: T4, count: 1, attach: [{pcieRoot: pci0000:10}], nodeAllocatable: {memory: {perPod: 1Gi}}}
""")
    instance = unique_name("fdn")
    config = driver_config.build(instance, f"{instance}.example.com", [], nodes={simulated_node: path},
                                 namespace=dra_namespace, workers=2)
    driver, text = _publish_error(k8s, config)
    name = render.slice_name(simulated_node, driver.drivers.gpu, 0)
    assert f"ResourceSlice {name} (node {simulated_node}, driver {driver.drivers.gpu})" in text, text
    assert "(403 Forbidden)" in text and f'node "{simulated_node}" does not support DRANodeAllocatableResources' in text, text


def _publish_error(k8s, config) -> tuple[FakeDriver, str]:
    """Start a fake-driver instance whose publishing must fail; return it (stopped, its slices deleted) and
    the text of the PublishError."""
    driver = FakeDriver(config, k8s.api_client).start()
    try:
        with pytest.raises(PublishError) as info:
            driver.publish(timeout=30)
    finally:
        driver.stop(delete_slices=True)
    return driver, str(info.value)
