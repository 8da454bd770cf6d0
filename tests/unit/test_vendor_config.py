"""The VendorDriver file: every problem named with file, field, value and what is allowed, from the
file alone (load) and against the cluster (harness.vendor.cluster_check, here over recorded API objects)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from fake_devices.errors import InvalidInput
from harness.config import featuregates
from harness.vendor import cluster_check
from harness.vendor import file as vendor

REPO = Path(__file__).resolve().parents[2]
HEAD = "apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: VendorDriver\nmetadata: {name: acme}\n"


def _file(tmp_path: Path, spec: str) -> str:
    path = tmp_path / "vendor.yaml"
    path.write_text(HEAD + "spec:\n" + spec)
    return str(path)


def _problems(path: str) -> list[str]:
    with pytest.raises(InvalidInput) as caught:
        vendor.load(path)
    return [str(p) for p in caught.value.problems]


def test_a_good_file(tmp_path):
    loaded = vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n  deviceClasses: {gpu: acme-gpu}\n"
                                         "  extendedResources: {gpu: acme.example/gpu}\n"
                                         "  features: [DRAExtendedResource]\n  nodeSelector: acme.example/gpu=yes\n"))
    assert loaded.drivers == ("gpu.acme.example",) and loaded.node_selector == "acme.example/gpu=yes"
    assert loaded.test_image == vendor.DEFAULT_TEST_IMAGE and loaded.default_image


def test_the_fake_drivers_own_tests_run_only_when_the_file_asks(tmp_path):
    assert not vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n")).run_fake_driver_tests
    assert vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n  runFakeDriverTests: true\n")
                       ).run_fake_driver_tests
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  runFakeDriverTests: 'yes'\n")
    assert _problems(path) == [f"{path}: spec.runFakeDriverTests: must be true or false, not 'yes' "
                               "(allowed: true, false)"]


def test_a_plugin_run_by_a_daemon_set_is_named_by_namespace_and_name(tmp_path):
    loaded = vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n  pluginDaemonSet: acme-system/acme-plugin\n"))
    assert loaded.plugin_daemon_set == ("acme-system", "acme-plugin")
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  pluginDaemonSet: acme-plugin\n")
    assert _problems(path) == [f"{path}: spec.pluginDaemonSet: 'acme-plugin' is not namespace/name of a DaemonSet "
                               "(allowed: <namespace>/<name>, e.g. acme-system/acme-kubelet-plugin)"]
    plugin = tmp_path / "plugin"
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    path = _file(tmp_path, f"  drivers: [gpu.acme.example]\n  pluginDaemonSet: acme-system/acme-plugin\n"
                           f"  kubeletPlugin: {{command: {plugin}}}\n")
    assert [p for p in _problems(path) if "pluginDaemonSet" in p] == [
        f"{path}: spec.pluginDaemonSet: is set together with spec.kubeletPlugin (allowed: one of spec.kubeletPlugin "
        "(the harness starts the plugin) or spec.pluginDaemonSet (your DaemonSet runs it))"]


def test_every_problem_is_located(tmp_path):
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  deviceClasses: {gpu: Acme_GPU}\n"
                           "  extendedResources: {nic: acme.example/nic, gpu: 'kubernetes.io/gpu'}\n"
                           "  features: [DRAExtendedResources]\n  nodeSelector: 'a in (b'\n"
                           "  pluginLog: /no/such/plugin.log\n")
    problems = _problems(path)
    known = ", ".join(featuregates.SUITE_FEATURES)
    assert problems == [
        f"{path}: spec.deviceClasses.gpu: 'Acme_GPU' is not a DeviceClass name (allowed: a DNS subdomain)",
        f"{path}: spec.extendedResources.nic: device type 'nic' has no entry in spec.deviceClasses (allowed: gpu)",
        f"{path}: spec.extendedResources.gpu: 'kubernetes.io/gpu' is not an extended resource name "
        "(allowed: [domain/]name outside kubernetes.io, e.g. acme.example/gpu)",
        f"{path}: spec.features[0]: unknown feature 'DRAExtendedResources' (allowed: {known})",
        f"{path}: spec.nodeSelector: 'a in (b' is not a label selector "
        "(allowed: comma-separated key=value, key!=value, key or !key terms)",
        f"{path}: spec.pluginLog: '/no/such/plugin.log' is not a file (allowed: the path of the kubelet plugin's log)",
    ]


def test_known_features_are_the_suites():
    marked = set()
    for test_file in (REPO / "conformance").glob("*.py"):
        marked |= set(re.findall(r'dra_feature\("([A-Za-z]+)"', test_file.read_text()))
    assert marked == set(featuregates.SUITE_FEATURES)


def test_default_image_is_the_real_nodes_pause_image():
    from harness.backends.local.realnode import images

    assert vendor.DEFAULT_TEST_IMAGE == images.PAUSE_IMAGE


class FakeCluster:
    """Recorded API objects, answering the few list/read calls the cluster check makes."""

    def __init__(self, classes, nodes, slices):
        self.resource = NS(list_device_class=lambda: NS(items=classes),
                           list_resource_slice=lambda field_selector: NS(items=[
                               s for s in slices if f"spec.driver={s.spec.driver}" == field_selector]))
        self.core = NS(list_node=lambda label_selector=None: NS(items=[
            n for n in nodes if label_selector is None or label_selector in n.metadata.labels]))


def _node(name, images=(), kwok=False, labels=()):
    return NS(metadata=NS(name=name, annotations={"kwok.x-k8s.io/node": "fake"} if kwok else {},
                          labels=list(labels)),
              status=NS(images=[NS(names=list(images))]))


def test_against_the_cluster(tmp_path):
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  deviceClasses: {gpu: acme-gpu, nic: acme-nic}\n"
                           "  extendedResources: {gpu: acme.example/gpu}\n  nodeSelector: acme.example/gpu\n")
    loaded = vendor.load(path)
    cluster = FakeCluster(
        classes=[NS(metadata=NS(name="acme-gpu"), spec=NS(extended_resource_name=None)),
                 NS(metadata=NS(name="other"), spec=NS(extended_resource_name="other.example/thing"))],
        nodes=[_node("real-0", images=["docker.io/library/busybox:1.36", "dra-harness.local/shell:1"]),
               _node("kwok-0", kwok=True)],
        slices=[NS(spec=NS(driver="gpu.acme.example", node_name="real-0")),
                NS(spec=NS(driver="gpu.acme.example", node_name="kwok-0"))])
    with pytest.raises(InvalidInput) as caught:
        cluster_check.check_against_cluster(loaded, cluster)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}: spec.deviceClasses.nic: DeviceClass 'acme-nic' does not exist in the cluster "
        "(allowed: acme-gpu, other)",
        f"{path}: spec.extendedResources.gpu: no DeviceClass maps 'acme.example/gpu' (spec.extendedResourceName) "
        "(allowed: other.example/thing)",
        f"{path}: spec.nodeSelector: 'acme.example/gpu' matches no node "
        "(allowed: a selector of the nodes where your driver publishes devices)",
        f"{path}: spec.testImage (default): 'dra-harness.local/pause:1' is not on node real-0, where your driver "
        "publishes devices (allowed: an image the node has: busybox:1.36, docker.io/library/busybox:1.36, "
        "dra-harness.local/shell:1, library/busybox:1.36)",
    ]


# --- spec.kubeletPlugin and spec.manifests -------------------------------------------------------

def _executable(directory: Path, name: str = "acme-plugin") -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


CLASS = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: acme-gpu}\nspec: {}\n"


def test_a_good_plugin_section(tmp_path):
    _executable(tmp_path)
    (tmp_path / "class.yaml").write_text(CLASS)
    loaded = vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n  manifests: [class.yaml]\n"
                                         "  kubeletPlugin:\n    command: ./acme-plugin\n"
                                         "    args: ['--node={nodeName}', '--cdi={cdiDir}', '--reg={registrationDir}',"
                                         " '--plugins={pluginsDir}', '--kubeconfig={kubeconfig}', '--x={{y}}']\n"
                                         "    env: {ACME_NODE: '{nodeName}', ACME_LEVEL: '4'}\n"))
    plugin = loaded.kubelet_plugin
    assert plugin is not None and plugin.command == str(tmp_path / "acme-plugin")  # relative to the vendor file
    values = {"nodeName": "n-0", "cdiDir": "/c", "registrationDir": "/r", "pluginsDir": "/p", "kubeconfig": "/k"}
    assert plugin.argv(values) == [str(tmp_path / "acme-plugin"), "--node=n-0", "--cdi=/c", "--reg=/r",
                                   "--plugins=/p", "--kubeconfig=/k", "--x={y}"]
    assert plugin.environment(values) == {"ACME_NODE": "n-0", "ACME_LEVEL": "4"}
    assert [(m.kind, m.name) for m in loaded.manifests] == [("DeviceClass", "acme-gpu")]


def test_the_command_may_name_the_binary_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    values = vendor.command_values()
    (tmp_path / "cache" / "binaries" / values["platform"]).mkdir(parents=True)
    built = _executable(tmp_path / "cache" / "binaries" / values["platform"], "plugin")
    loaded = vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n"
                                         "  kubeletPlugin: {command: '{binaryCache}/{platform}/plugin'}\n"))
    assert loaded.kubelet_plugin is not None and loaded.kubelet_plugin.command == str(built)


def test_every_plugin_problem_is_located(tmp_path):
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    (tmp_path / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    (tmp_path / "class.yaml").write_text(CLASS)
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  pluginLog: " + str(tmp_path / "class.yaml") + "\n"
                           "  manifests: [pod.yaml, class.yaml, class.yaml, missing.yaml]\n"
                           "  kubeletPlugin:\n    command: ./not-executable\n"
                           "    args: ['--node={node}', 7, '--a={binaryCache}', '--b={nodeName!r}', '--c={']\n"
                           "    env: {1BAD: x, GOOD: 3, ALSO: '{cdi}'}\n    restartPolicy: Always\n")
    problems = _problems(path)
    allowed = "{nodeName}, {registrationDir}, {pluginsDir}, {cdiDir}, {kubeconfig}"
    expected = [
        f"spec.kubeletPlugin.command: './not-executable' ({tmp_path}/not-executable) is not an executable file",
        f"spec.kubeletPlugin.args[0]: '--node={{node}}': unknown placeholder {{node}} (allowed: {allowed})",
        "spec.kubeletPlugin.args[1]: must be a string, not 7 (allowed: a string (quote numbers and true/false))",
        f"spec.kubeletPlugin.args[2]: '--a={{binaryCache}}': unknown placeholder {{binaryCache}} (allowed: {allowed})",
        "spec.kubeletPlugin.args[3]: '--b={nodeName!r}': placeholder {nodeName!r} has a conversion or format",
        "spec.kubeletPlugin.args[4]: '--c={': Single '{' encountered in format string",
        "spec.kubeletPlugin.env.1BAD: '1BAD' is not an environment variable name",
        "spec.kubeletPlugin.env.GOOD: must be a string, not 3",
        f"spec.kubeletPlugin.env.ALSO: '{{cdi}}': unknown placeholder {{cdi}} (allowed: {allowed})",
        "spec.kubeletPlugin.restartPolicy: unknown field (allowed: args, command, env)",
        "spec.pluginLog: is set together with spec.kubeletPlugin",
        "spec.manifests[0]: 'pod.yaml' is v1/Pod (allowed: resource.k8s.io/v1 DeviceClass)",
        "spec.manifests[2]: 'class.yaml': DeviceClass 'acme-gpu' is named twice in spec.manifests",
        "spec.manifests[3]: 'missing.yaml': ",
    ]
    assert len(problems) == len(expected), "\n".join(problems)
    for text, problem in zip(expected, problems):
        assert f"{path}: {text}" in problem, f"{text!r} not in {problem!r}"


def test_a_missing_command_says_where_it_looked(tmp_path):
    problems = _problems(_file(tmp_path, "  drivers: [gpu.acme.example]\n  kubeletPlugin:\n"
                                         "    command: '{binaryCache}/nope/plugin'\n"))
    assert len(problems) == 1 and "spec.kubeletPlugin.command: '{binaryCache}/nope/plugin' (" in problems[0]
    assert "/binaries/nope/plugin) does not exist" in problems[0] and "make binaries" in problems[0]
    problems = _problems(_file(tmp_path, "  drivers: [gpu.acme.example]\n  kubeletPlugin: {command: '{cache}/x'}\n"))
    assert problems == [f"{tmp_path}/vendor.yaml: spec.kubeletPlugin.command: '{{cache}}/x': unknown placeholder "
                        "{cache} (allowed: {binaryCache}, {platform}, {python} in the command)"]
    problems = _problems(_file(tmp_path, "  drivers: [gpu.acme.example]\n  kubeletPlugin: [a]\n"))
    assert problems == [f"{tmp_path}/vendor.yaml: spec.kubeletPlugin: must be a mapping, not a list "
                        "(allowed: a mapping of field: value)"]


def test_the_shipped_example_driver_file_names_every_host_path():
    text = (REPO / "clusters" / "vendors" / "dra-example-driver.yaml").read_text()
    for name in vendor.PLUGIN_PLACEHOLDERS:
        assert "{" + name + "}" in text, name


def _api_error(status: int, message: str):
    from kubernetes.client.rest import ApiException

    err = ApiException(status=status, reason="Invalid")
    err.body = '{"message": "%s"}' % message
    return err


def test_manifests_against_the_cluster(tmp_path):
    (tmp_path / "class.yaml").write_text(CLASS)
    (tmp_path / "bad.yaml").write_text(CLASS.replace("acme-gpu", "acme-bad"))
    (tmp_path / "taken.yaml").write_text(CLASS.replace("acme-gpu", "taken"))
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  deviceClasses: {gpu: acme-gpu}\n"
                           "  manifests: [class.yaml, bad.yaml, taken.yaml]\n")
    loaded = vendor.load(path)
    created = []

    def dry_run(body, dry_run=None):
        assert dry_run == "All"  # never a real create while checking
        created.append(body["metadata"]["name"])
        if body["metadata"]["name"] == "acme-bad":
            raise _api_error(422, "spec.selectors[0].cel.expression: Invalid value")
        return NS(metadata=NS(name=body["metadata"]["name"]), spec=NS(extended_resource_name=None))

    cluster = FakeCluster(classes=[NS(metadata=NS(name="taken"), spec=NS(extended_resource_name=None))], nodes=[],
                          slices=[])
    cluster.resource.create_device_class = dry_run
    with pytest.raises(InvalidInput) as caught:
        cluster_check.check_against_cluster(loaded, cluster)
    problems = [str(p) for p in caught.value.problems]
    assert len(problems) == 2, problems  # acme-gpu counts as existing: the run creates it
    assert problems[0].startswith(f"{path}: spec.manifests[1]: {tmp_path}/bad.yaml: the API server refuses it: "
                                  "spec.selectors[0].cel.expression: Invalid value")
    assert problems[1].startswith(f"{path}: spec.manifests[2]: DeviceClass 'taken' already exists in the cluster")
    assert created == ["acme-gpu", "acme-bad"]


def test_the_shipped_partitions_file_loads_and_names_every_host_path(monkeypatch, tmp_path):
    monkeypatch.setenv("DRA_HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    values = vendor.command_values()
    target = tmp_path / "cache" / "binaries" / f"dra-example-driver-v0.4.0_{values['platform']}"
    target.mkdir(parents=True)
    _executable(target, "dra-example-kubeletplugin")
    for name in ("dra-example-driver.yaml", "dra-example-driver-partitions.yaml", "dra-example-driver-shared.yaml"):
        loaded = vendor.load(str(REPO / "clusters" / "vendors" / name))
        assert loaded.kubelet_plugin is not None and loaded.drivers == ("gpu.example.com",)
        text = (REPO / "clusters" / "vendors" / name).read_text()
        assert all("{" + placeholder + "}" in text for placeholder in vendor.PLUGIN_PLACEHOLDERS), name
    partitions = vendor.load(str(REPO / "clusters" / "vendors" / "dra-example-driver-partitions.yaml"))
    assert "--gpu-partitions=4" in partitions.kubelet_plugin.args
    assert partitions.features == frozenset({"DRAPartitionableDevices"})


def test_a_good_health_monitor_section(tmp_path):
    _executable(tmp_path, "acme-fault")
    loaded = vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n  healthMonitor:\n"
                                         "    ruleSelector: acme.example/health-monitor=node-agent\n"
                                         "    inject: [./acme-fault, inject, '{node}', '{driver}/{pool}/{device}', "
                                         "'--kind={kind}']\n"
                                         "    recover: [sh, -c, 'true', '{node}', '{device}']\n"))
    monitor = loaded.health_monitor
    assert monitor is not None and monitor.rule_selector == "acme.example/health-monitor=node-agent"
    assert monitor.inject == (str(tmp_path / "acme-fault"), "inject", "{node}", "{driver}/{pool}/{device}",
                              "--kind={kind}")  # the program resolved beside the vendor file
    assert monitor.recover == ("sh", "-c", "true", "{node}", "{device}")  # on PATH: as written


def test_every_health_monitor_problem_is_located(tmp_path):
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  healthMonitor:\n"
                           "    ruleSelector: 'a in (b'\n"
                           "    inject: [./not-executable, '{nodeName}', 7, '{kind!r}']\n"
                           "    recover: []\n    interval: 5\n")
    problems = _problems(path)
    allowed = "{node}, {driver}, {pool}, {device}, {kind}"
    expected = [
        "spec.healthMonitor.ruleSelector: 'a in (b' is not a label selector (allowed: comma-separated key=value",
        f"spec.healthMonitor.inject[0]: './not-executable' is not an executable file ({tmp_path}/not-executable) "
        "(allowed: an executable: a path (absolute, or relative to the vendor file) or a program on PATH)",
        f"spec.healthMonitor.inject[1]: '{{nodeName}}': unknown placeholder {{nodeName}} (allowed: {allowed})",
        "spec.healthMonitor.inject[2]: must be a non-empty string, not 7 (allowed: a string (quote numbers and "
        "true/false))",
        "spec.healthMonitor.inject[3]: '{kind!r}': placeholder {kind!r} has a conversion or format",
        "spec.healthMonitor.recover: is an empty list (allowed: a program, then its arguments)",
        "spec.healthMonitor.interval: unknown field (allowed: inject, recover, ruleSelector)",
    ]
    assert len(problems) == len(expected), "\n".join(problems)
    for text, problem in zip(expected, problems):
        assert f"{path}: {text}" in problem, f"{text!r} not in {problem!r}"


def test_a_health_monitor_needs_its_selector_and_both_commands(tmp_path):
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  healthMonitor:\n"
                           "    inject: [no-such-acme-fault-tool, '{device}']\n    recover: [sh, '{kind}']\n")
    assert _problems(path) == [
        f"{path}: spec.healthMonitor.ruleSelector: is required (allowed: a value for ruleSelector)",
        f"{path}: spec.healthMonitor.inject[0]: 'no-such-acme-fault-tool' is not on PATH ({os.environ['PATH']}) "
        "(allowed: an executable: a path (absolute, or relative to the vendor file) or a program on PATH)",
        f"{path}: spec.healthMonitor.recover[1]: '{{kind}}': unknown placeholder {{kind}} "
        "(allowed: {node}, {driver}, {pool}, {device})",
    ]
    path = _file(tmp_path, "  drivers: [gpu.acme.example]\n  healthMonitor: {ruleSelector: a=b}\n")
    problems = _problems(path)
    assert [p.split(": ", 2)[1] for p in problems] == ["spec.healthMonitor.inject", "spec.healthMonitor.recover"]
    assert "is required (allowed: the command (a list: program, then arguments) that makes a device degraded or " \
           "failed)" in problems[0]


def test_the_command_monitor_runs_the_vendors_commands_with_the_device_filled_in(tmp_path):
    from conformance.health_monitors import CommandMonitor, Target

    record = tmp_path / "ran.txt"
    script = tmp_path / "acme-fault"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\n[ \"$1\" != fail ]\n")
    script.chmod(0o755)
    loaded = vendor.load(_file(tmp_path, "  drivers: [gpu.acme.example]\n  healthMonitor:\n"
                                         "    ruleSelector: acme.example/hm=1\n"
                                         "    inject: [./acme-fault, inject, '{node}', '{pool}/{device}', '{kind}']\n"
                                         "    recover: [./acme-fault, '{driver}', '{device}']\n"))
    monitor = CommandMonitor(loaded.health_monitor)
    target = Target("node-a", "gpu.acme.example", "pool-a", "gpu-1")
    monitor.inject(target, "failed")
    monitor.recover(target)
    assert record.read_text().splitlines() == ["inject node-a pool-a/gpu-1 failed", "gpu.acme.example gpu-1"]
    assert monitor.rule_selector == "acme.example/hm=1" and monitor.stop() is None
    failing = CommandMonitor(vendor.HealthMonitor("a=b", (str(script), "fail", "{device}"), (str(script),)))
    with pytest.raises(AssertionError, match=r"exited with 1"):
        failing.inject(target, "degraded")
    assert "fail gpu-1 -> 1" in failing.tail()
