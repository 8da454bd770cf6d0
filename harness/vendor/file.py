"""Vendor mode: the description of a driver under test that is not ours (`--driver-config vendor.yaml`).

    apiVersion: dra-harness.x-k8s.io/v1alpha1
    kind: VendorDriver
    metadata: {name: acme-gpu}
    spec:
      drivers: [gpu.acme.example]            # driver names it publishes ResourceSlices as
      deviceClasses: {gpu: acme-gpu}         # device type -> the DeviceClass it installs
      extendedResources: {gpu: acme.example/gpu}   # device type -> the extendedResourceName of that class
      features: [DRAExtendedResource, DRADeviceTaints, DRAPartitionableDevices]   # what it claims to support
      nodeSelector: acme.example/gpu=present # label selector of the nodes where every driver has devices
      testImage: registry.k8s.io/pause:3.10  # what the kubelet checks run (default: the real node's pause image)
      pluginLog: /var/log/acme-plugin.log    # the kubelet plugin's log, for failure diagnostics
      kubeletPlugin:                         # or: the harness starts the plugin on the local real node
        command: /opt/acme/acme-kubeletplugin
        args: [--node-name={nodeName}, --kubeconfig={kubeconfig}, --cdi-root={cdiDir},
               --registrar-dir={registrationDir}, --plugins-dir={pluginsDir}]
        env: {ACME_LOG_LEVEL: "4"}
      pluginDaemonSet: acme-system/acme-kubelet-plugin   # or: your plugin's DaemonSet, whose pod on a node
                                             # the harness deletes to crash the plugin there (namespace/name)
      manifests: [acme-gpu-class.yaml]       # DeviceClasses the run creates before the tests and deletes after
      healthMonitor:                         # your node health monitor, judged by conformance/test_health_monitor.py
        ruleSelector: acme.example/health-monitor=node-agent   # label selector of the DeviceTaintRules it owns
        inject: [acme-fault, inject, "{node}", "{device}", "{kind}"]   # make a device {kind}: degraded | failed
        recover: [acme-fault, clear, "{node}", "{device}"]              # make it healthy again
      runFakeDriverTests: false              # true: also the tests of the fake driver's own powers (below)

`runFakeDriverTests: true` runs the tests marked `fake_devices` as well: they start fake-driver instances
of their own on the cluster's simulated (KWOK) nodes and never use your driver. The kind backend sets it
in the file it writes for the fake driver it deploys, which is the driver those tests are about.

`load` checks the file alone (types, names, known features, the plugin's command and placeholders,
the manifests), reporting every problem with file, field, value and what is allowed, before anything is
started; `harness.vendor.cluster_check` checks it against the cluster under test.
"""

from __future__ import annotations

import os
import re
import shutil
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fake_devices import yamlfile
from fake_devices.errors import InvalidInput, Problem
from fake_devices.schema import DNS_SUBDOMAIN, Reader, read_header
from harness.binaries import host_platform
from harness.config.featuregates import SUITE_FEATURES
from harness.core import paths

KIND = "VendorDriver"
API_VERSION = "dra-harness.x-k8s.io/v1alpha1"
# The local backend's real node has this image without a registry (harness/backends/local/realnode/images.py);
# elsewhere the vendor names one its nodes have. Spelled out, not imported: importing the local backend
# would cost seconds before the file is even read (tests/unit keeps the two equal).
DEFAULT_TEST_IMAGE = "dra-harness.local/pause:1"
EXTENDED_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                                    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# What `{name}` in spec.kubeletPlugin args and env stands for, per real node (the same keys as
# `dra-harness cluster node-paths --json`, harness.vendor.plugins.node_paths fills them in).
PLUGIN_PLACEHOLDERS = {
    "nodeName": "the real node's name",
    "registrationDir": "the kubelet's plugin registration directory (plugins_registry)",
    "pluginsDir": "the kubelet's plugins directory (each driver's dra.sock lives below it)",
    "cdiDir": "the directory of CDI specs the node's containerd reads",
    "kubeconfig": "the cluster's admin kubeconfig",
}
# What `{name}` in spec.kubeletPlugin.command stands for: where the harness keeps the binaries it builds
# (the example driver's plugin among them), so a vendor file in the repository needs no absolute path.
# `{python}` is the interpreter dra-harness runs on: a plugin written in Python (the fake driver's own,
# clusters/vendors/fake-driver.yaml) is started as `{python} -m its.module`, found wherever dra-harness is installed.
COMMAND_PLACEHOLDERS = ("binaryCache", "platform", "python")
# What `{name}` in spec.healthMonitor.inject and .recover stands for: the device a test makes unhealthy
# (conformance/health_monitors.py fills them in); the first word of each may use COMMAND_PLACEHOLDERS.
MONITOR_PLACEHOLDERS = {
    "node": "the node the device is on",
    "driver": "the device's driver",
    "pool": "the device's pool",
    "device": "the device's name in its pool",
    "kind": "what to make it: degraded (still works: NoSchedule expected) or failed (NoExecute expected)",
}
RECOVER_PLACEHOLDERS = ("node", "driver", "pool", "device")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MANIFEST_API_VERSION = "resource.k8s.io/v1"
MANIFEST_KINDS = ("DeviceClass",)
SELECTOR_TERM = re.compile(r"^\s*!?\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*((!=|==|=)\s*[-A-Za-z0-9_.]*)?\s*$")


@dataclass(frozen=True)
class KubeletPlugin:
    """The vendor's kubelet plugin as the harness starts it on a real node: `command` is an executable
    file (placeholders already filled in); `args` and `env` still hold the node placeholders."""

    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, values: dict[str, str]) -> list[str]:
        return [self.command, *(fill(arg, values) for arg in self.args)]

    def environment(self, values: dict[str, str]) -> dict[str, str]:
        return {name: fill(value, values) for name, value in self.env.items()}


@dataclass(frozen=True)
class HealthMonitor:
    """The vendor's node health monitor as the tests reach it: the label selector of the
    DeviceTaintRules it owns and the commands (argv, no shell; the first word resolved to an executable
    at load) that make a device unhealthy and healthy again, placeholders still in."""

    rule_selector: str
    inject: tuple[str, ...]
    recover: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """A cluster-scoped object of spec.manifests: created by the run, deleted after it."""

    path: str
    kind: str
    name: str
    body: dict


def fill(template: str, values: dict[str, str]) -> str:
    """`template` with each `{name}` replaced (names checked by `placeholder_problems` at load)."""
    return template.format_map(values)


def placeholder_problems(template: str, allowed) -> list[str]:
    """What is wrong with the `{name}` fields of `template`: unknown names, conversions, stray braces."""
    try:
        fields = [name for _, name, spec, conv in string.Formatter().parse(template) if name is not None
                  and not (spec or conv)]
        odd = [f"{{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
               for _, name, spec, conv in string.Formatter().parse(template) if name is not None and (spec or conv)]
    except ValueError as err:  # a lone { or }
        return [f"{template!r}: {err} (write {{{{ and }}}} for literal braces)"]
    problems = [f"{template!r}: placeholder {text} has a conversion or format" for text in odd]
    problems += [f"{template!r}: unknown placeholder {{{name}}}" if name else f"{template!r}: empty placeholder {{}}"
                 for name in fields if name not in allowed]
    return problems


def command_values() -> dict[str, str]:
    os_name, arch = host_platform()
    return {"binaryCache": str(paths.cache_root() / "binaries"), "platform": f"{os_name}-{arch}",
            "python": sys.executable}


@dataclass(frozen=True)
class VendorDriver:
    name: str
    drivers: tuple[str, ...]
    device_classes: dict[str, str] = field(default_factory=dict)
    extended_resources: dict[str, str] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    test_image: str = DEFAULT_TEST_IMAGE
    node_selector: str = ""  # label selector of the nodes where every driver publishes devices ("": not said)
    plugin_log: str = ""
    source: str = ""  # the file it came from, for located errors later
    kubelet_plugin: KubeletPlugin | None = None  # the harness starts it on the local backend's real node
    manifests: tuple[Manifest, ...] = ()
    health_monitor: HealthMonitor | None = None  # the tests of test_health_monitor.py reach it through commands
    run_fake_driver_tests: bool = False  # also the tests marked fake_devices (the kind backend's own driver)
    plugin_daemon_set: tuple[str, str] | None = None  # (namespace, name): the plugin runs as this DaemonSet

    @property
    def default_image(self) -> bool:
        return self.test_image == DEFAULT_TEST_IMAGE


def load(path: str) -> VendorDriver:
    problems: list[Problem] = []
    data = yamlfile.load(path)  # bounded, strict YAML: the shared reader of every input file
    top = Reader(data, path, "", problems)
    name, spec = read_header(top, API_VERSION, KIND)
    drivers = []
    for i, driver in enumerate(spec.scalars("drivers")):
        if not isinstance(driver, str) or not DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
            spec.fail(f"spec.drivers[{i}]", f"{driver!r} is not a driver name", "a DNS subdomain of at most 63 characters")
        else:
            drivers.append(driver)
    if not drivers and "drivers" not in [p.field for p in problems]:
        spec.fail("spec.drivers", "must name at least one driver")
    classes = {str(k): str(v) for k, v in spec.raw_mapping("deviceClasses").items()}
    for kind, device_class in classes.items():
        if not DNS_SUBDOMAIN.match(device_class):
            spec.fail(f"spec.deviceClasses.{kind}", f"{device_class!r} is not a DeviceClass name", "a DNS subdomain")
    extended = {str(k): str(v) for k, v in spec.raw_mapping("extendedResources").items()}
    for kind, resource in extended.items():
        if kind not in classes:
            spec.fail(f"spec.extendedResources.{kind}", f"device type {kind!r} has no entry in spec.deviceClasses",
                      ", ".join(sorted(classes)) or "a device type named in spec.deviceClasses")
        elif not EXTENDED_RESOURCE_NAME.match(resource) or resource.startswith(("kubernetes.io/", "requests.")):
            spec.fail(f"spec.extendedResources.{kind}", f"{resource!r} is not an extended resource name",
                      "[domain/]name outside kubernetes.io, e.g. acme.example/gpu")
    features = []
    for i, feature in enumerate(spec.scalars("features")):
        if str(feature) not in SUITE_FEATURES:
            spec.fail(f"spec.features[{i}]", f"unknown feature {feature!r}", ", ".join(SUITE_FEATURES))
        else:
            features.append(str(feature))
    test_image = spec.str("testImage", default=DEFAULT_TEST_IMAGE)
    node_selector = spec.str("nodeSelector", default="") or ""
    if node_selector and not all(SELECTOR_TERM.match(term) for term in node_selector.split(",")):
        spec.fail("spec.nodeSelector", f"{node_selector!r} is not a label selector",
                  "comma-separated key=value, key!=value, key or !key terms")
    plugin_log = spec.str("pluginLog", default="") or ""
    if plugin_log and not Path(plugin_log).expanduser().is_file():
        spec.fail("spec.pluginLog", f"{plugin_log!r} is not a file", "the path of the kubelet plugin's log")
    plugin = _kubelet_plugin(spec, Path(path).parent) if "kubeletPlugin" in spec.data else None
    if "kubeletPlugin" in spec.data and plugin_log:
        spec.fail("spec.pluginLog", "is set together with spec.kubeletPlugin, whose log the harness keeps itself",
                  "one of spec.pluginLog (you start the plugin) or spec.kubeletPlugin (the harness does)")
    manifests = _manifests(spec, Path(path).parent)
    monitor = _health_monitor(spec, Path(path).parent) if "healthMonitor" in spec.data else None
    fake_driver_tests = spec.bool("runFakeDriverTests", default=False)
    daemon_set = _plugin_daemon_set(spec)
    spec.done()
    top.done()
    if problems:
        raise InvalidInput(problems)
    return VendorDriver(name or "", tuple(drivers), classes, extended, frozenset(features),
                        test_image or DEFAULT_TEST_IMAGE, node_selector, plugin_log, path, plugin, manifests, monitor,
                        fake_driver_tests, daemon_set)


def _executable_problem(command: str, base: Path) -> tuple[str, str] | None:
    """(what is wrong, the path looked at) when `command` (placeholders filled in) names no executable
    file: a path (absolute, or relative to the vendor file) or a name on PATH."""
    if "/" not in command:
        return None if shutil.which(command) else ("is not on PATH", os.environ.get("PATH", ""))
    resolved = Path(command).expanduser()
    resolved = resolved if resolved.is_absolute() else base / resolved
    if resolved.is_file() and os.access(resolved, os.X_OK):
        return None
    return ("does not exist" if not resolved.exists() else "is not an executable file"), str(resolved)


def _health_monitor(spec: Reader, base: Path) -> HealthMonitor | None:
    """spec.healthMonitor: a label selector and two commands whose placeholders are known."""
    section = spec.mapping("healthMonitor")
    if not isinstance(spec.data.get("healthMonitor"), dict):
        return None  # the reader said it must be a mapping
    before = len(spec.problems)
    selector = section.str("ruleSelector", required=True)
    if selector is not None and (not selector.strip() or
                                 not all(SELECTOR_TERM.match(term) for term in selector.split(","))):
        section.fail("spec.healthMonitor.ruleSelector", f"{selector!r} is not a label selector",
                     "comma-separated key=value, key!=value, key or !key terms naming the DeviceTaintRules "
                     "your monitor owns, e.g. acme.example/health-monitor=node-agent")
    commands = {}
    for key, allowed in (("inject", tuple(MONITOR_PLACEHOLDERS)), ("recover", RECOVER_PLACEHOLDERS)):
        where = f"spec.healthMonitor.{key}"
        if key not in section.data or section.data[key] is None:
            section.scalars(key)  # seen
            section.fail(where, "is required", f"the command (a list: program, then arguments) that "
                         f"{'makes a device degraded or failed' if key == 'inject' else 'makes a device healthy again'}")
            continue
        argv = section.scalars(key)
        if isinstance(section.data.get(key), list) and not argv:
            section.fail(where, "is an empty list", "a program, then its arguments")
        words = []
        for i, word in enumerate(argv):
            if not isinstance(word, str) or not word:
                section.fail(f"{where}[{i}]", f"must be a non-empty string, not {word!r}",
                             "a string (quote numbers and true/false)")
                continue
            names = COMMAND_PLACEHOLDERS if i == 0 else allowed
            problems = placeholder_problems(word, names)
            for problem in problems:
                section.fail(f"{where}[{i}]", problem, ", ".join(f"{{{n}}}" for n in names)
                             + (" in the program" if i == 0 else ""))
            if i == 0 and not problems:
                word = fill(word, command_values())
                wrong = _executable_problem(word, base)
                if wrong is not None:
                    section.fail(f"{where}[0]", f"{argv[0]!r} {wrong[0]} ({wrong[1]})",
                                 "an executable: a path (absolute, or relative to the vendor file) or a program "
                                 "on PATH")
                elif "/" in word:
                    path = Path(word).expanduser()
                    word = str(path if path.is_absolute() else base / path)
            words.append(word)
        commands[key] = tuple(words)
    section.done()
    if len(spec.problems) > before or selector is None:
        return None
    return HealthMonitor(selector, commands["inject"], commands["recover"])


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _plugin_daemon_set(spec: Reader) -> tuple[str, str] | None:
    """spec.pluginDaemonSet: `namespace/name` of the DaemonSet that runs the plugin (not with kubeletPlugin)."""
    text = spec.str("pluginDaemonSet", default="") or ""
    if not text:
        return None
    namespace, _, name = text.partition("/")
    if not (DNS_LABEL.match(namespace) and DNS_SUBDOMAIN.match(name)):
        spec.fail("spec.pluginDaemonSet", f"{text!r} is not namespace/name of a DaemonSet",
                  "<namespace>/<name>, e.g. acme-system/acme-kubelet-plugin")
        return None
    if "kubeletPlugin" in spec.data:
        spec.fail("spec.pluginDaemonSet", "is set together with spec.kubeletPlugin",
                  "one of spec.kubeletPlugin (the harness starts the plugin) or spec.pluginDaemonSet (your "
                  "DaemonSet runs it)")
        return None
    return namespace, name


def _kubelet_plugin(spec: Reader, base: Path) -> KubeletPlugin | None:
    """spec.kubeletPlugin: an executable command, string args and env whose placeholders are known."""
    section = spec.mapping("kubeletPlugin")
    if not isinstance(spec.data.get("kubeletPlugin"), dict):
        return None  # the reader said it must be a mapping
    before = len(spec.problems)
    command = section.str("command", required=True)
    allowed = ", ".join(f"{{{name}}}" for name in PLUGIN_PLACEHOLDERS)
    if command is not None:
        for problem in placeholder_problems(command, COMMAND_PLACEHOLDERS):
            section.fail("spec.kubeletPlugin.command", problem,
                         ", ".join(f"{{{name}}}" for name in COMMAND_PLACEHOLDERS) + " in the command")
        if len(spec.problems) == before:
            resolved = Path(fill(command, command_values())).expanduser()
            resolved = resolved if resolved.is_absolute() else base / resolved  # beside the vendor file
            if not resolved.is_file() or not os.access(resolved, os.X_OK):
                what = "does not exist" if not resolved.exists() else "is not an executable file"
                section.fail("spec.kubeletPlugin.command", f"{command!r} ({resolved}) {what}",
                             "the path of your plugin's executable (absolute, or relative to the vendor file; "
                             "the example driver's is built by `make binaries`)")
            command = str(resolved)
    args = []
    for i, arg in enumerate(section.scalars("args")):
        if not isinstance(arg, str):
            section.fail(f"spec.kubeletPlugin.args[{i}]", f"must be a string, not {arg!r}",
                         "a string (quote numbers and true/false)")
            continue
        for problem in placeholder_problems(arg, PLUGIN_PLACEHOLDERS):
            section.fail(f"spec.kubeletPlugin.args[{i}]", problem, allowed)
        args.append(arg)
    env = {}
    for key, value in section.raw_mapping("env").items():
        where = f"spec.kubeletPlugin.env.{key}"
        if not isinstance(key, str) or not ENV_NAME.match(key):
            section.fail(where, f"{key!r} is not an environment variable name", "letters, digits and _, not first a digit")
        elif not isinstance(value, str):
            section.fail(where, f"must be a string, not {value!r}", "a string (quote numbers and true/false)")
        else:
            for problem in placeholder_problems(value, PLUGIN_PLACEHOLDERS):
                section.fail(where, problem, allowed)
            env[key] = value
    section.done()
    if len(spec.problems) > before or command is None:
        return None
    return KubeletPlugin(command, tuple(args), env)


def _manifests(spec: Reader, base: Path) -> tuple[Manifest, ...]:
    """spec.manifests: files of one DeviceClass each (relative to the vendor file), checked here for
    kind and name; the API server checks the rest (a dry run before anything is created)."""
    found: list[Manifest] = []
    for i, entry in enumerate(spec.scalars("manifests")):
        where = f"spec.manifests[{i}]"
        if not isinstance(entry, str) or not entry:
            spec.fail(where, f"must be a file name, not {entry!r}", "the path of a YAML file (relative to the vendor file)")
            continue
        target = Path(entry).expanduser()
        target = target if target.is_absolute() else base / target
        try:
            body = yamlfile.load(target)
        except InvalidInput as err:
            for problem in err.problems:
                spec.fail(where, f"{entry!r}: {problem.field}: {problem.problem}", problem.allowed)
            continue
        if not isinstance(body, dict):
            spec.fail(where, f"{entry!r} is not a Kubernetes object", f"a {', '.join(MANIFEST_KINDS)} manifest")
            continue
        kind, version = body.get("kind"), body.get("apiVersion")
        name = (body.get("metadata") or {}).get("name") if isinstance(body.get("metadata"), dict) else None
        if kind not in MANIFEST_KINDS or version != MANIFEST_API_VERSION:
            spec.fail(where, f"{entry!r} is {version}/{kind}", f"{MANIFEST_API_VERSION} {', '.join(MANIFEST_KINDS)}")
        elif not isinstance(name, str) or not DNS_SUBDOMAIN.match(name):
            spec.fail(where, f"{entry!r}: metadata.name {name!r} is not a {kind} name", "a DNS subdomain")
        elif any(m.kind == kind and m.name == name for m in found):
            spec.fail(where, f"{entry!r}: {kind} {name!r} is named twice in spec.manifests", "each object once")
        else:
            found.append(Manifest(str(target), kind, name, body))
    return tuple(found)
