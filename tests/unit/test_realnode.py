"""The real node of the local backend (harness/backends/local/realnode/) and its runtime
(harness/binaries/noderuntime.py), as pure data and logic: no root, no processes, no machine changes.

Everything that would touch the machine (/proc, `ip`, `iptables`, cgroupfs) is replaced by tmp files
or recorded calls, so these tests check exactly what would be done, not that it can be done here.
Commands go through a `Runner` (harness/backends/commands.py) that the tests build from a fake `run`
and `which` and hand in, as the kind backend's tests do.
"""

from __future__ import annotations

import ipaddress
import json
import os
import platform
import re
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from harness.backends.commands import Runner
from harness.backends.local import reservations
from harness.backends.local.realnode import (
    cgroups,
    containerd,
    host,
    images,
    inotify,
    kubelet,
    network,
    node,
    plugins,
    preflight,
    teardown,
)
from harness.backends.local.realnode.hostfacts import HostFacts
from harness.binaries import gobuild, noderuntime
from harness.binaries.noderuntime import NodeRuntime
from harness.core import nodelayout as layout
from harness.core import paths
from harness.core.errors import BinariesError, HarnessError
from harness.core.nodelayout import NodeDirs, RealNodeRecord
from harness.migration import local as migration_local

NODE_ID = "0123abcd"


def _record(directory: Path | str) -> RealNodeRecord:
    return RealNodeRecord(name="real-node-0", id=NODE_ID, directory=str(directory), bridge="drh-0123abcd",
                          subnet="10.202.41.0/24", address="10.202.41.1", kubelet_port=20001, healthz_port=20002)


def _runtime(tmp_path: Path) -> NodeRuntime:
    return NodeRuntime(directory=tmp_path / "runtime", runc=Path("/usr/sbin/runc"), cni_dir=Path("/usr/lib/cni"),
                       busybox=Path("/bin/busybox"))


def _completed(argv, returncode=0, stdout="", stderr=""):
    return subprocess.CompletedProcess(argv, returncode, stdout=stdout, stderr=stderr)


def _times_out(argv, timeout=None, **kwargs):
    raise subprocess.TimeoutExpired(argv, timeout)


# --- network ------------------------------------------------------------------------------------


def test_choose_subnet_is_a_stable_slash_24_of_the_pool():
    first = network.choose_subnet(NODE_ID, [])
    assert first.prefixlen == 24
    assert first.subnet_of(network.SUBNET_POOL)
    assert network.choose_subnet(NODE_ID, []) == first
    assert network.choose_subnet("deadbeef", []) != first  # different nodes spread over the pool


def test_choose_subnet_skips_used_networks():
    first = network.choose_subnet(NODE_ID, [])
    second = network.choose_subnet(NODE_ID, [first])
    assert second != first
    assert not second.overlaps(first)
    assert second == ipaddress.ip_network(f"{first.network_address + 256}/24")  # the next candidate
    # A single address routed inside the first candidate is just as much in the way.
    host_route = ipaddress.ip_network(f"{first.network_address + 7}/32")
    assert network.choose_subnet(NODE_ID, [host_route]) == second


def test_choose_subnet_wraps_around_the_pool():
    first = network.choose_subnet(NODE_ID, [])
    rest = list(ipaddress.summarize_address_range(first.network_address, network.SUBNET_POOL.broadcast_address))
    assert network.choose_subnet(NODE_ID, rest) == ipaddress.ip_network("10.200.0.0/24")


def test_choose_subnet_ignores_default_routes():
    """0.0.0.0/0 overlaps everything; a default route must not make the pool look full."""
    assert network.choose_subnet(NODE_ID, [ipaddress.ip_network("0.0.0.0/0")]) == network.choose_subnet(NODE_ID, [])


@pytest.mark.parametrize("used", ["10.200.0.0/14", "10.0.0.0/8"])
def test_choose_subnet_fails_when_the_pool_is_used(used):
    with pytest.raises(HarnessError, match=r"no free /24 left in 10\.200\.0\.0/14"):
        network.choose_subnet(NODE_ID, [ipaddress.ip_network(used)])


def test_bridge_name_fits_an_interface_name():
    assert network.bridge_name(NODE_ID) == "drh-0123abcd"
    long = network.bridge_name("0123456789abcdef")
    assert long == "drh-0123456789a" and len(long) == 15
    assert network.bridge_name(NODE_ID).startswith("drh-")


def test_gateway_is_the_first_host():
    assert network.gateway(ipaddress.ip_network("10.202.41.0/24")) == "10.202.41.1"


def test_cni_conflist(tmp_path):
    """Bridge without masquerade (pod traffic never leaves the machine), host-local IPAM under the node dir."""
    subnet = ipaddress.ip_network("10.202.41.0/24")
    config = json.loads(network.cni_conflist("dra-harness-x", "drh-x", subnet, tmp_path / "ipam"))
    assert config["cniVersion"] == "1.0.0"
    assert config["name"] == "dra-harness-x"
    bridge, loopback = config["plugins"]
    assert loopback == {"type": "loopback"}
    assert bridge["type"] == "bridge"
    assert bridge["bridge"] == "drh-x"
    assert bridge["ipMasq"] is False
    assert bridge["isGateway"] is True
    assert bridge["ipam"] == {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                              "ranges": [[{"subnet": "10.202.41.0/24", "gateway": "10.202.41.1"}]],
                              "routes": [{"dst": "10.202.41.0/24"}]}


def test_used_networks_reads_routes_and_addresses():
    routes = [{"dst": "default", "gateway": "192.168.1.1"}, {"dst": "10.0.0.0/8"}, {"dst": "192.168.1.5"},
              {"type": "local", "dst": "127.0.0.0/8", "table": "local"}, {"dst": ""}, {"dst": "not-an-ip"}]
    addrs = [{}, {"ifname": "eth0", "addr_info": [{"local": "192.168.1.5", "prefixlen": 24}]}]
    calls = []

    def run(argv, **kwargs):
        calls.append(tuple(argv[1:]))
        return _completed(argv, stdout=json.dumps(routes if "route" in argv else addrs))

    assert network.used_networks(Runner(run=run)) == [ipaddress.ip_network(n) for n in
                                       ("10.0.0.0/8", "192.168.1.5/32", "127.0.0.0/8", "192.168.1.0/24")]
    assert calls == [("-4", "-j", "route", "show", "table", "all"), ("-4", "-j", "addr")]


def test_used_networks_survives_a_failing_ip():
    assert network.used_networks(Runner(run=lambda argv, **kw: _completed(argv, 1, stderr="no netlink"))) == []
    assert network.used_networks(Runner(run=lambda argv, **kw: _completed(argv, stdout="not json"))) == []


def test_create_bridge_commands():
    calls = []

    def run(argv, **kwargs):
        calls.append(argv[1:])
        return _completed(argv, returncode=1 if argv[1:3] == ["link", "show"] else 0)

    network.create_bridge("drh-x", ipaddress.ip_network("10.202.41.0/24"), Runner(run=run))
    assert calls == [["link", "show", "drh-x"], ["link", "add", "drh-x", "type", "bridge"],
                     ["addr", "replace", "10.202.41.1/24", "dev", "drh-x"], ["link", "set", "drh-x", "up"]]


def test_delete_bridge_reports_failure():
    def run(argv, **kwargs):
        return _completed(argv, returncode=0 if argv[1:3] == ["link", "show"] else 2, stderr="busy\n")

    assert network.delete_bridge("drh-x", Runner(run=run)) == ["bridge drh-x: busy"]
    gone = Runner(run=lambda argv, **kw: _completed(argv, returncode=1))
    assert network.delete_bridge("drh-x", gone) == []  # already gone


# --- host: iptables -----------------------------------------------------------------------------


BASELINE_FILTER = [":INPUT ACCEPT [5:100]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [9:900]", ":DOCKER - [0:0]",
                   "-A INPUT -i lo -j ACCEPT", "-A FORWARD -j DOCKER"]
AFTER_FILTER = [":INPUT ACCEPT [0:0]", ":FORWARD DROP [3:30]", ":OUTPUT ACCEPT [12:1200]", ":DOCKER - [0:0]",
                ":KUBE-FIREWALL - [0:0]", "-A INPUT -i lo -j ACCEPT", "-A INPUT -j KUBE-FIREWALL",
                "-A FORWARD -j DOCKER"]


@pytest.fixture
def iptables():
    """`iptables` found at /sbin/iptables; `iptables-save` prints the rules after the node given by the
    test; every other call is recorded (`runner` runs them)."""
    state = SimpleNamespace(after={"filter": AFTER_FILTER}, calls=[], fail=set())

    def run(argv, **kwargs):
        if argv[0].endswith("-save"):  # iptables-save -t TABLE
            return _completed(argv, stdout="".join(f"{line}\n" for line in state.after.get(argv[-1], [])))
        state.calls.append(argv)
        failed = any(action in argv for action in state.fail)
        return _completed(argv, returncode=1 if failed else 0, stderr="Chain is in use\n" if failed else "")

    state.runner = Runner(run=run, which=lambda name: f"/sbin/{name}")
    return state


def test_restore_iptables_removes_only_what_was_added(iptables):
    """Changed counters are not a new chain: INPUT/FORWARD/OUTPUT stay; the kubelet's rule and chain go."""
    assert host._restore_iptables("iptables", {"filter": BASELINE_FILTER}, iptables.runner) == []
    assert iptables.calls == [["/sbin/iptables", "-w", "-t", "filter", "-D", "INPUT", "-j", "KUBE-FIREWALL"],
                              ["/sbin/iptables", "-w", "-t", "filter", "-F", "KUBE-FIREWALL"],
                              ["/sbin/iptables", "-w", "-t", "filter", "-X", "KUBE-FIREWALL"]]


def test_restore_iptables_deletes_rules_last_added_first(iptables):
    iptables.after = {"nat": [":POSTROUTING ACCEPT [0:0]", ":KUBE-POSTROUTING - [0:0]",
                              '-A POSTROUTING -m comment --comment "kubernetes postrouting" -j KUBE-POSTROUTING',
                              "-A KUBE-POSTROUTING -j RETURN"]}
    assert host._restore_iptables("ip6tables", {"nat": [":POSTROUTING ACCEPT [7:7]"]}, iptables.runner) == []
    assert iptables.calls == [
        ["/sbin/ip6tables", "-w", "-t", "nat", "-D", "KUBE-POSTROUTING", "-j", "RETURN"],
        ["/sbin/ip6tables", "-w", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment",
         "kubernetes postrouting", "-j", "KUBE-POSTROUTING"],
        ["/sbin/ip6tables", "-w", "-t", "nat", "-F", "KUBE-POSTROUTING"],
        ["/sbin/ip6tables", "-w", "-t", "nat", "-X", "KUBE-POSTROUTING"]]


def test_restore_iptables_reports_failures(iptables):
    """A chain that cannot be flushed is not deleted, and both failures are reported."""
    iptables.fail = {"-D", "-F"}
    assert host._restore_iptables("iptables", {"filter": BASELINE_FILTER}, iptables.runner) == [
        "iptables -t filter: cannot delete '-A INPUT -j KUBE-FIREWALL': Chain is in use",
        "iptables -t filter -F KUBE-FIREWALL: Chain is in use"]
    assert [c[4:] for c in iptables.calls] == [["-D", "INPUT", "-j", "KUBE-FIREWALL"], ["-F", "KUBE-FIREWALL"]]


def test_restore_iptables_without_iptables():
    def run(argv, **kwargs):
        pytest.fail(f"ran {argv} without iptables")

    assert host._restore_iptables("iptables", {}, Runner(run=run, which=lambda name: None)) == []


def test_iptables_rules_keeps_chains_and_rules():
    calls = []
    save = "# Generated by iptables-save\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j X\nCOMMIT\n# Completed\n"

    def run(argv, **kwargs):
        calls.append(argv)
        return _completed(argv, returncode=1 if argv[-1] == "raw" else 0, stdout=save)

    runner = Runner(run=run, which=lambda name: f"/sbin/{name}")
    assert host.iptables_rules("iptables", runner) == {t: [":INPUT ACCEPT [0:0]", "-A INPUT -j X"]
                                                       for t in ("filter", "nat", "mangle")}
    assert calls == [["/sbin/iptables-save", "-t", t] for t in host.TABLES]
    assert host.iptables_rules("iptables", Runner(run=run, which=lambda name: None)) == {}


# --- host: sysctls, runtime dirs ------------------------------------------------------------------


def _proc_sys(root: Path, values: dict[str, str]) -> Path:
    """A /proc/sys under `root` with a file per sysctl of `values` (name -> content)."""
    proc_sys = root / "proc-sys"
    proc_sys.mkdir()
    for name, value in values.items():
        path = host.sysctl_path(name, proc_sys)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
    return proc_sys


def test_write_sysctls_writes_only_changed_values(tmp_path):
    proc_sys = _proc_sys(tmp_path, {"vm.overcommit_memory": "1\n",
                                    "kernel.panic": "0   \n"})  # equal after strip: must stay byte for byte as it is
    (proc_sys / "vm" / "panic_on_oom").mkdir()  # kernel.panic_on_oops is missing
    failed = host.write_sysctls({"vm.overcommit_memory": "0", "kernel.panic": "0", "kernel.panic_on_oops": "1",
                                 "vm.panic_on_oom": "0"}, proc_sys)
    assert (proc_sys / "vm" / "overcommit_memory").read_text() == "0\n"
    assert (proc_sys / "kernel" / "panic").read_text() == "0   \n"
    assert failed == ["sysctl kernel.panic_on_oops=1: No such file or directory",
                      "sysctl vm.panic_on_oom=0: Is a directory"]


def test_read_sysctls_skips_what_the_kernel_lacks(tmp_path):
    proc_sys = _proc_sys(tmp_path, {"kernel.panic": "10\n", "net.ipv4.ip_forward": "1\n"})
    assert host.read_sysctls(proc_sys) == {"kernel.panic": "10", "net.ipv4.ip_forward": "1"}


def test_sysctl_path():
    assert host.sysctl_path("net.ipv4.ip_forward") == Path("/proc/sys/net/ipv4/ip_forward")


def test_snapshot(tmp_path, monkeypatch):
    existing, absent = tmp_path / "run-containerd", tmp_path / "run-containerd-s"
    existing.mkdir()
    monkeypatch.setattr(host, "RUNTIME_DIRS", (absent, existing))
    proc_sys = _proc_sys(tmp_path, {"kernel.panic": "0\n"})
    def save(argv, **kwargs):  # iptables-save knows only the filter table; its one chain is named after it
        binary = Path(argv[0]).name.removesuffix("-save")
        return _completed(argv, stdout=f":{binary} - [0:0]\n") if argv[-1] == "filter" else _completed(argv, 1)

    assert host.snapshot(Runner(run=save, which=lambda name: f"/sbin/{name}"), proc_sys) == {
        "sysctls": {"kernel.panic": "0"},
        "iptables": {"iptables": {"filter": [":iptables - [0:0]"]}, "ip6tables": {"filter": [":ip6tables - [0:0]"]}},
        "runtimeDirs": [str(existing)]}


def test_restore_removes_only_empty_runtime_dirs_it_made(tmp_path, monkeypatch):
    inner, outer, kept = tmp_path / "containerd" / "s", tmp_path / "containerd", tmp_path / "kept"
    inner.mkdir(parents=True)
    kept.mkdir()
    monkeypatch.setattr(host, "RUNTIME_DIRS", (inner, outer, kept))
    monkeypatch.setattr(host, "write_sysctls", lambda values: [f"sysctl {n}" for n in values])
    def run(argv, **kwargs):  # a chain the node added, which cannot be flushed
        if argv[0].endswith("-save"):
            return _completed(argv, stdout=":KUBE-X - [0:0]\n" if argv[-1] == "filter" else "")
        return _completed(argv, 1, stderr="in use")

    baseline = {"sysctls": {"kernel.panic": "0"}, "iptables": {"iptables": {"filter": []}},
                "runtimeDirs": [str(kept)]}
    assert host.restore(baseline, Runner(run=run, which=lambda name: f"/sbin/{name}")) == [
        "sysctl kernel.panic", "iptables -t filter -F KUBE-X: in use"]
    assert not outer.exists()
    assert kept.is_dir()


def test_restore_reports_a_runtime_dir_that_is_not_empty(tmp_path, monkeypatch):
    inner, outer = tmp_path / "containerd" / "s", tmp_path / "containerd"
    inner.mkdir(parents=True)
    (inner / "shim.sock").write_text("")
    monkeypatch.setattr(host, "RUNTIME_DIRS", (inner, outer))
    assert host.restore({}, Runner(run=lambda argv, **kw: pytest.fail(f"ran {argv}"))) == [
        f"{inner} is not empty", f"{outer} is not empty"]


# --- host: acquire / release: tests/unit/test_host_settings.py --------------------------------------


# --- cgroups --------------------------------------------------------------------------------------


V2 = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
"""
HYBRID = """\
25 23 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
"""
V1 = """\
25 23 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec - tmpfs tmpfs rw,mode=755
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
40 1 0:40 / /srv/container/sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
"""
NONE = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
"""


@pytest.mark.parametrize("mountinfo, expected_layout, expected_mounts", [
    (V2, "v2", ["/sys/fs/cgroup"]),
    (HYBRID, "hybrid", ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/systemd",
                        "/sys/fs/cgroup/unified"]),
    (V1, "v1", ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/memory"]),
    (NONE, "none", []),
    ("", "none", []),
], ids=["v2", "hybrid", "v1", "none", "empty"])
def test_cgroup_layout(tmp_path, mountinfo, expected_layout, expected_mounts):
    """Only cgroup mounts below /sys/fs/cgroup count (not the tmpfs above them, not another root's)."""
    (tmp_path / "mountinfo").write_text(mountinfo)
    mounts = cgroups.hierarchies(mountinfo=tmp_path / "mountinfo")
    assert mounts == [Path(m) for m in expected_mounts]
    assert cgroups.layout_of(mounts) == expected_layout


def test_cgroup_layout_without_mountinfo(tmp_path):
    assert cgroups.hierarchies(mountinfo=tmp_path / "absent") == []
    assert cgroups.layout_of([]) == "none"


def test_cgroup_parent_name():
    assert cgroups.parent_name(NODE_ID) == "dra-harness-0123abcd"


def test_cgroup_create_v1_copies_cpuset(tmp_path):
    """A new v1 cpuset cgroup has no CPUs: it gets its parent's, or no task could run in it."""
    cpuset, memory = tmp_path / "cpuset", tmp_path / "memory"
    for mount in (cpuset, memory):
        (mount / "dra-harness-0123abcd").mkdir(parents=True)
    (cpuset / "cpuset.cpus").write_text("0-7\n")
    (cpuset / "cpuset.mems").write_text("0\n")
    (cpuset / "dra-harness-0123abcd" / "cpuset.cpus").write_text("\n")
    (cpuset / "dra-harness-0123abcd" / "cpuset.mems").write_text("")
    assert cgroups.create(NODE_ID, [cpuset, memory]) == [cpuset / "dra-harness-0123abcd",
                                                         memory / "dra-harness-0123abcd"]
    assert (cpuset / "dra-harness-0123abcd" / "cpuset.cpus").read_text() == "0-7\n"
    assert (cpuset / "dra-harness-0123abcd" / "cpuset.mems").read_text() == "0\n"
    assert list((memory / "dra-harness-0123abcd").iterdir()) == []  # no cpuset files there: nothing written


def test_cgroup_create_v2_delegates_controllers(tmp_path):
    root = tmp_path / "cgroup"
    (root / "dra-harness-0123abcd").mkdir(parents=True)
    (root / "dra-harness-0123abcd" / "cgroup.controllers").write_text("cpu memory pids\n")
    assert cgroups.create(NODE_ID, [tmp_path / "cgroup"], root=root) == [root / "dra-harness-0123abcd"]
    assert (root / "dra-harness-0123abcd" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"


def test_cgroup_pids_and_existing(tmp_path):
    memory, cpu = tmp_path / "memory", tmp_path / "cpu"
    (memory / "dra-harness-0123abcd" / "kubepods" / "pod1").mkdir(parents=True)
    cpu.mkdir()
    (memory / "dra-harness-0123abcd" / "cgroup.procs").write_text("")
    (memory / "dra-harness-0123abcd" / "kubepods" / "pod1" / "cgroup.procs").write_text("101\n102\n")
    (memory / "dra-harness-0123abcd" / "kubepods" / "cgroup.procs").write_text("102\nnot-a-pid\n")
    assert cgroups.existing(NODE_ID, [cpu, memory]) == [memory / "dra-harness-0123abcd"]
    assert cgroups.pids(NODE_ID, [cpu, memory]) == {101, 102}  # a file that does not parse is skipped whole


def test_cgroup_remove_deepest_first(tmp_path, monkeypatch):
    memory = tmp_path / "memory"
    for sub in ("kubepods/burstable/pod1/c1", "kubepods/besteffort", "kubepods/pod2"):
        (memory / "dra-harness-0123abcd" / sub).mkdir(parents=True)
    monkeypatch.setattr(cgroups.os, "kill", lambda pid, sig: pytest.fail(f"kill({pid}) with no pids"))
    assert cgroups.remove(NODE_ID, timeout=0, mounts=[memory]) == []
    assert list(memory.iterdir()) == []


def test_cgroup_remove_and_pids_survive_cgroups_that_vanish_meanwhile(tmp_path, monkeypatch):
    """runc removes a killed container's cgroup while the teardown walks the tree (seen in CI:
    FileNotFoundError from Path.rglob made `cluster down` fail with a traceback)."""
    memory = tmp_path / "memory"
    top = memory / "dra-harness-0123abcd"
    gone = top / "kubepods" / "besteffort" / "pod1" / "c1"
    gone.mkdir(parents=True)
    real_scandir = os.scandir

    def scandir(path="."):
        if Path(path) == gone.parent:
            gone.rmdir()  # removed by someone else between seeing pod1 and listing it
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert cgroups.pids(NODE_ID, [memory]) == set()
    assert cgroups.remove(NODE_ID, timeout=0, mounts=[memory]) == []
    assert list(memory.iterdir()) == []


def test_cgroup_remove_reports_what_is_left(tmp_path):
    memory = tmp_path / "memory"
    (memory / "dra-harness-0123abcd" / "kubepods").mkdir(parents=True)
    (memory / "dra-harness-0123abcd" / "stuck").write_text("")  # rmdir fails like a busy cgroup
    assert cgroups.remove(NODE_ID, timeout=0, mounts=[memory]) == [
        f"cgroup {memory / 'dra-harness-0123abcd'}: Directory not empty"]
    assert not (memory / "dra-harness-0123abcd" / "kubepods").exists()


# --- containerd -----------------------------------------------------------------------------------


def test_containerd_config(tmp_path):
    dirs = NodeDirs(tmp_path / "node")
    runtime = _runtime(tmp_path)
    config = tomllib.loads(containerd.config_toml(dirs, runtime, images.PAUSE_IMAGE))
    assert config["version"] == 3
    assert config["imports"] == []  # the machine's /etc/containerd/conf.d stays out
    assert config["root"] == str(tmp_path / "node" / "containerd" / "root")
    assert config["state"] == str(tmp_path / "node" / "containerd" / "state")
    assert config["grpc"] == {"address": str(tmp_path / "node" / "containerd" / "containerd.sock")}
    assert config["ttrpc"] == {"address": str(tmp_path / "node" / "containerd" / "containerd.sock.ttrpc")}
    assert "io.containerd.nri.v1.nri" in config["disabled_plugins"]

    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["cdi_spec_dirs"] == [str(tmp_path / "node" / "cdi")]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "Root": str(tmp_path / "node" / "runc"),
                               "SystemdCgroup": False}
    assert cri["cni"] == {"bin_dirs": ["/usr/lib/cni"], "conf_dir": str(tmp_path / "node" / "cni" / "net.d")}

    assert config["plugins"]["io.containerd.cri.v1.images"] == {
        "snapshotter": "overlayfs", "pinned_images": {"sandbox": "dra-harness.local/pause:1"}}
    server = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert server["disable_tcp_service"] is True
    assert server["stream_server_address"] == "127.0.0.1"


def test_containerd_config_quotes_paths(tmp_path):
    """Paths are TOML strings: quotes and backslashes in them must not break the file."""
    dirs = NodeDirs(tmp_path / 'we"ird\\dir é')
    config = tomllib.loads(containerd.config_toml(dirs, _runtime(tmp_path), images.PAUSE_IMAGE))
    assert config["root"] == str(tmp_path / 'we"ird\\dir é' / "containerd" / "root")


def test_containerd_argv_and_env(tmp_path, monkeypatch):
    dirs, runtime = NodeDirs(tmp_path / "node"), _runtime(tmp_path)
    assert containerd.argv(dirs, runtime) == [str(tmp_path / "runtime" / "containerd"),
                                              f"--config={tmp_path / 'node' / 'containerd' / 'config.toml'}"]
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert containerd.env(runtime) == {"PATH": f"{tmp_path / 'runtime'}:/usr/bin:/bin"}  # finds its shim first


def test_import_images_checks_the_result(tmp_path):
    dirs, runtime = NodeDirs(tmp_path / "node"), _runtime(tmp_path)
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return _completed(argv, stdout=f"{images.PAUSE_IMAGE}\nother:1\n" if "list" in argv else "")

    archives = {images.PAUSE_IMAGE: tmp_path / "p.tar", images.SHELL_IMAGE: tmp_path / "s.tar"}
    with pytest.raises(HarnessError, match=r"images not in containerd after import: dra-harness\.local/shell:1$"):
        containerd.import_images(dirs, runtime, archives, Runner(run=run))
    prefix = [str(tmp_path / "runtime" / "ctr"), f"--address={dirs.containerd_socket}", "--namespace=k8s.io"]
    assert calls == [[*prefix, "images", "import", "--local", str(tmp_path / "p.tar")],
                     [*prefix, "images", "import", "--local", str(tmp_path / "s.tar")],
                     [*prefix, "images", "list", "--quiet"]]


def test_ctr_failure_is_a_harness_error(tmp_path):
    failing = Runner(run=lambda argv, **kw: _completed(argv, 1, stderr="no socket\n"))
    with pytest.raises(HarnessError, match=r"^`ctr version` failed: no socket$"):
        containerd.ctr(NodeDirs(tmp_path), _runtime(tmp_path), "version", runner=failing)
    # a ctr that does not answer is a failure with the reason, not an exception from subprocess
    with pytest.raises(HarnessError, match=r"^`ctr version` failed: no answer within 10s$"):
        containerd.ctr(NodeDirs(tmp_path), _runtime(tmp_path), "version", timeout=10,
                       runner=Runner(run=_times_out))


# --- kubelet --------------------------------------------------------------------------------------


def test_kubelet_config(tmp_path):
    record = _record(tmp_path / "node")
    config = kubelet.config(record, "/pki/ca.crt")
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/dra-harness-0123abcd"
    assert config["cgroupRoot"] == "/" + cgroups.parent_name(record.id)  # the parent cgroups.create() makes
    assert config["oomScoreAdj"] == 0
    assert config["address"] == config["healthzBindAddress"] == "10.202.41.1"
    assert "0.0.0.0" not in yaml.safe_dump(config)
    assert (config["port"], config["healthzPort"], config["readOnlyPort"]) == (20001, 20002, 0)
    assert config["authentication"] == {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                        "x509": {"clientCAFile": "/pki/ca.crt"}}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["registerWithTaints"] == [{"key": "dra-harness.x-k8s.io/real-node", "value": "true",
                                             "effect": "NoSchedule"}]
    assert config["registerWithTaints"][0]["key"] == kubelet.TAINT_KEY
    socket = f"unix://{tmp_path / 'node' / 'containerd' / 'containerd.sock'}"
    assert config["containerRuntimeEndpoint"] == config["imageServiceEndpoint"] == socket
    assert config["podLogsDir"] == str(tmp_path / "node" / "pod-logs")
    assert config["podCIDR"] == "10.202.41.0/24"


def test_kubelet_config_yaml_round_trips(tmp_path):
    record = _record(tmp_path / "node")
    assert yaml.safe_load(kubelet.config_yaml(record, "/ca")) == kubelet.config(record, "/ca")


def test_kubelet_argv(tmp_path):
    record = _record(tmp_path / "node")
    argv = kubelet.argv("/bin/kubelet", record, "/kc", {"z": "1", "kubernetes.io/os": "linux", "a": "2"},
                        ["--feature-gates=DRAFoo=true"], verbosity=3)
    assert argv == ["/bin/kubelet", f"--config={tmp_path / 'node' / 'kubelet-config.yaml'}", "--kubeconfig=/kc",
                    f"--root-dir={tmp_path / 'node' / 'kubelet'}", "--hostname-override=real-node-0",
                    "--node-ip=10.202.41.1", "--node-labels=a=2,kubernetes.io/os=linux,z=1",
                    "--feature-gates=DRAFoo=true", "--v=3"]


def test_kubelet_health_url(tmp_path):
    assert kubelet.health_url(_record(tmp_path)) == "http://10.202.41.1:20002/healthz"


# --- layout ---------------------------------------------------------------------------------------


def test_node_id(tmp_path):
    ident = layout.node_id(tmp_path / "c1", "real-node-0")
    assert re.fullmatch(r"[0-9a-f]{8}", ident)
    assert layout.node_id(tmp_path / "c1", "real-node-0") == ident
    assert layout.node_id(tmp_path / "c2", "real-node-0") != ident
    assert layout.node_id(tmp_path / "c1", "real-node-1") != ident


def test_node_root(monkeypatch, tmp_path):
    monkeypatch.delenv(layout.NODE_ROOT_ENV, raising=False)
    assert layout.node_root() == Path("/var/lib/dra-harness")
    monkeypatch.setenv(layout.NODE_ROOT_ENV, str(tmp_path))
    assert layout.node_root() == tmp_path


def test_record_round_trip(tmp_path):
    record = _record(tmp_path / "node")
    data = record.to_dict()
    assert data == {"name": "real-node-0", "id": NODE_ID, "directory": str(tmp_path / "node"),
                    "bridge": "drh-0123abcd", "subnet": "10.202.41.0/24", "address": "10.202.41.1",
                    "kubelet_port": 20001, "healthz_port": 20002}
    assert RealNodeRecord.from_dict(data) == record
    assert RealNodeRecord.from_dict(yaml.safe_load(yaml.safe_dump(data))) == record  # as state.yaml keeps it
    assert RealNodeRecord.from_dict({**data, "added-later": 1}) == record
    assert layout.records({"realNodes": [data]}) == [record]
    assert layout.records({}) == []


def test_record_names(tmp_path):
    record = _record(tmp_path)
    assert record.dirs == NodeDirs(tmp_path)
    assert (record.kubelet_process, record.containerd_process) == ("kubelet-real-node-0", "containerd-real-node-0")
    assert record.plugin_process("gpu.example.com") == "kubelet-plugin-real-node-0-gpu.example.com"


def test_node_dirs_stay_under_the_base(tmp_path):
    dirs = NodeDirs(tmp_path)
    assert len(set(dirs.all())) == 12
    for path in [*dirs.all(), dirs.containerd_socket, dirs.containerd_config, dirs.kubelet_config]:
        assert path.is_relative_to(tmp_path), path
    assert dirs.plugins == tmp_path / "kubelet" / "plugins"
    assert dirs.plugins_registry == tmp_path / "kubelet" / "plugins_registry"


def _registration_socket(driver: str) -> str:
    dirs = NodeDirs(layout.node_root() / NODE_ID)
    return str(dirs.plugins_registry / f"{driver}-reg.sock")


def test_plugin_sockets_fit_under_the_default_node_root(monkeypatch):
    """sun_path holds 107 bytes. Under /var/lib/dra-harness/<id> the registration socket
    (`.../kubelet/plugins_registry/<driver>-reg.sock`) leaves 43 bytes for the driver name: the fake
    driver's names fit, a 50-character one does not (the plugin refuses it at start)."""
    from fake_devices.kubeletplugin.config import MAX_SOCKET_PATH

    monkeypatch.delenv(layout.NODE_ROOT_ENV, raising=False)
    assert MAX_SOCKET_PATH == 107
    assert _registration_socket("") == "/var/lib/dra-harness/0123abcd/kubelet/plugins_registry/-reg.sock"
    assert len(_registration_socket("d" * 43)) == 107
    assert len(_registration_socket("d" * 44)) == 108
    assert len(_registration_socket("d" * 50)) == 114 > MAX_SOCKET_PATH
    for driver in ("gpu.example.com", "storage.example.com", "nic.example.com"):
        assert len(_registration_socket(driver)) <= MAX_SOCKET_PATH
    dra_socket = NodeDirs(layout.node_root() / NODE_ID).plugins / ("d" * 50) / "dra.sock"
    assert len(str(dra_socket)) == 105  # dra.sock is shorter: registration is the limit


def test_plugin_config_enforces_the_socket_limit(monkeypatch):
    """The kubelet plugin's own check agrees with the arithmetic above."""
    from fake_devices.errors import InvalidInput
    from fake_devices.kubeletplugin.config import PluginConfig

    monkeypatch.delenv(layout.NODE_ROOT_ENV, raising=False)
    dirs = NodeDirs(layout.node_root() / NODE_ID)
    fits = "a" * 31 + ".example.com"  # 43 characters
    PluginConfig(fits, "real-node-0", plugins_dir=dirs.plugins, registry_dir=dirs.plugins_registry).validate()
    with pytest.raises(InvalidInput, match="socket path longer than 107 bytes"):
        PluginConfig("a" + fits, "real-node-0", plugins_dir=dirs.plugins,
                     registry_dir=dirs.plugins_registry).validate()


# --- plugins --------------------------------------------------------------------------------------


def test_plugin_argv_uses_the_node_directories(tmp_path):
    record = _record(tmp_path / "node")
    argv = plugins.argv(record, "gpu.example.com", tmp_path / "kc", "fake", "drh-system", health_interval=2.0)
    assert argv[1:] == ["-m", "fake_devices.kubeletplugin", "--driver=gpu.example.com", "--node=real-node-0",
                        f"--kubeconfig={tmp_path / 'kc'}",
                        f"--plugins-dir={tmp_path / 'node' / 'kubelet' / 'plugins'}",
                        f"--registry-dir={tmp_path / 'node' / 'kubelet' / 'plugins_registry'}",
                        f"--cdi-dir={tmp_path / 'node' / 'cdi'}",
                        f"--state-dir={tmp_path / 'node' / 'driver-state' / 'gpu.example.com'}",
                        "--health-interval=2.0", "--instance=fake", "--namespace=drh-system"]
    without = plugins.argv(record, "gpu.example.com", tmp_path / "kc", None, None)
    assert not any(a.startswith(("--instance", "--namespace")) for a in without)
    assert without[-1] == "--health-interval=10.0"


def test_plugin_cdi_dir_is_the_one_containerd_reads(tmp_path):
    record = _record(tmp_path / "node")
    config = tomllib.loads(containerd.config_toml(record.dirs, _runtime(tmp_path), images.PAUSE_IMAGE))
    nodeplugins = plugins.NodePlugins(tmp_path, record, tmp_path / "kc")
    assert config["plugins"]["io.containerd.cri.v1.runtime"]["cdi_spec_dirs"] == [str(nodeplugins.cdi_dir)]
    (record.dirs.cdi).mkdir(parents=True)
    for name in ("gpu.example.com-claim1.json", "gpu.example.com-claim0.json", "nic.example.com-c.json", "x.txt"):
        (record.dirs.cdi / name).write_text("{}")
    assert [p.name for p in nodeplugins.cdi_specs("gpu.example.com")] == ["gpu.example.com-claim0.json",
                                                                          "gpu.example.com-claim1.json"]
    assert len(nodeplugins.cdi_specs()) == 3


# --- node.plan_record -----------------------------------------------------------------------------


def test_plan_record_ties_the_pieces_together(tmp_path, monkeypatch):
    monkeypatch.setenv(layout.NODE_ROOT_ENV, str(tmp_path / "nodes"))
    holders = []

    def allocate(names, reserved=frozenset(), holder=None):
        holders.append(holder)
        return {names[0]: 20101, names[1]: 20102}

    monkeypatch.setattr(node.ports, "allocate", allocate)
    cluster = SimpleNamespace(directory=tmp_path / "clusters" / "c")
    ident = layout.node_id(tmp_path / "clusters" / "c", "real-node-0")
    subnet = network.choose_subnet(ident, [])
    record = node.plan_record(cluster, node.RealNodeSpec("real-node-0"), subnet, set())
    assert holders == [cluster.directory]  # reserved machine-wide for this cluster
    assert record == RealNodeRecord(name="real-node-0", id=ident, directory=str(tmp_path / "nodes" / ident),
                                    bridge=f"drh-{ident}", subnet=str(subnet), address=network.gateway(subnet),
                                    kubelet_port=20101, healthz_port=20102)


def test_clusters_of_other_state_directories_get_other_subnets(tmp_path, monkeypatch):
    """Two clusters plan their real nodes before either has made a bridge: the machine's routes show
    neither, and here both nodes' ids even start at the same subnet of the pool. The reservation
    keeps them apart; once a cluster is removed, its subnet is free again."""
    monkeypatch.setattr(reservations, "directory", lambda: tmp_path / "reservations")
    monkeypatch.setattr(node, "node_id", lambda directory, name: NODE_ID)
    no_routes = Runner(run=lambda argv, **kwargs: _completed(argv, stdout="[]"))  # `ip -j route` / `ip -j addr`
    first, second = (SimpleNamespace(directory=tmp_path / "state-a" / "clusters" / "c"),
                     SimpleNamespace(directory=tmp_path / "state-b" / "clusters" / "c"))
    first.directory.mkdir(parents=True)
    second.directory.mkdir(parents=True)
    specs = [node.RealNodeSpec("real-node-0"), node.RealNodeSpec("real-node-1")]
    ours = node._reserve_subnets(first, specs, no_routes)
    theirs = node._reserve_subnets(second, specs, no_routes)
    assert len(set(ours + theirs)) == 4, (ours, theirs)
    assert ours[0] == network.choose_subnet(NODE_ID, [])
    reservations.release(first.directory)
    assert node._reserve_subnets(SimpleNamespace(directory=second.directory), specs[:1], no_routes) == [ours[0]]


# --- teardown -------------------------------------------------------------------------------------


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
100 27 8:1 /var/lib/dra-harness/abc/kubelet /var/lib/dra-harness/abc/kubelet rw shared:50 - ext4 /dev/sda1 rw
101 100 8:1 /var/lib/dra-harness/abc/kubelet /var/lib/dra-harness/abc/kubelet rw shared:50 - ext4 /dev/sda1 rw
102 100 0:60 / /var/lib/dra-harness/abc/kubelet/pods/p1/volumes/kubernetes.io~empty-dir/a\\040b rw - tmpfs tmpfs rw
103 27 0:61 / /var/lib/dra-harness/abc/containerd/state/v2.task/k8s.io/c1/rootfs rw - overlay overlay rw
104 27 0:62 / /var/lib/dra-harness/abc rw - tmpfs tmpfs rw
105 27 0:63 / /var/lib/dra-harness/abc2 rw - tmpfs tmpfs rw
106 105 0:64 / /var/lib/dra-harness/abc2/kubelet rw - tmpfs tmpfs rw
107 27 0:65 / /var/lib/dra-harness/ab rw - tmpfs tmpfs rw
"""


@pytest.fixture
def mountinfo(tmp_path) -> Path:
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    return tmp_path / "mountinfo"


def test_mounts_under_deepest_first(mountinfo):
    """Children before parents (a mount with a mount on it cannot be unmounted), and abc2 is not abc."""
    abc = "/var/lib/dra-harness/abc"
    expected = [Path(p) for p in (
        f"{abc}/containerd/state/v2.task/k8s.io/c1/rootfs",
        f"{abc}/kubelet/pods/p1/volumes/kubernetes.io~empty-dir/a b",
        f"{abc}/kubelet", f"{abc}/kubelet",  # the kubelet's bind mount on itself: one entry per layer
        abc)]
    assert teardown.mounts_under(Path(abc), mountinfo) == expected
    assert teardown.mounts_under(Path(abc + "/"), mountinfo) == expected
    assert teardown.mounts_under(Path("/var/lib/dra-harness/abc2"), mountinfo) == [
        Path("/var/lib/dra-harness/abc2/kubelet"), Path("/var/lib/dra-harness/abc2")]
    assert teardown.mounts_under(Path("/var/lib/dra-harness/none"), mountinfo) == []


def test_mounts_under_without_mountinfo(tmp_path):
    assert teardown.mounts_under(Path("/var/lib/dra-harness/abc"), tmp_path / "absent") == []


def test_unmount_all_falls_back_to_lazy(monkeypatch):
    rounds = [[Path("/n/a/b"), Path("/n/a")], [Path("/n/a")], []]
    monkeypatch.setattr(teardown, "mounts_under", lambda directory: rounds.pop(0))
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return _completed(argv, returncode=1 if argv == ["umount", "/n/a"] else 0)

    assert teardown.unmount_all(Path("/n"), Runner(run=run)) == []
    assert calls == [["umount", "/n/a/b"], ["umount", "/n/a"], ["umount", "-l", "/n/a"],
                     ["umount", "/n/a"], ["umount", "-l", "/n/a"]]


def test_unmount_all_reports_what_stays(monkeypatch):
    monkeypatch.setattr(teardown, "mounts_under", lambda directory: [Path("/n/a")])
    assert teardown.unmount_all(Path("/n"), Runner(run=lambda argv, **kw: _completed(argv, 1))) == ["mount /n/a"]


def test_teardown_goes_on_after_a_step_fails_and_names_it(tmp_path, monkeypatch):
    """An OS error in one step (here the bridge) must not skip the cgroups, the directory check and
    the rest: it becomes a named leftover of `cluster down`."""
    node_record = _record(tmp_path / "node")
    node_record.dirs.base.mkdir(parents=True)
    done = []
    monkeypatch.setattr(teardown, "_stop", lambda cluster_dir, names: done.append(("stop", tuple(names))))
    monkeypatch.setattr(teardown, "processes_mentioning", lambda directory: [])
    monkeypatch.setattr(teardown, "unmount_all", lambda directory: done.append("unmount") or [])

    def bridge(name):
        raise PermissionError(1, "Operation not permitted", name)

    monkeypatch.setattr(teardown.network, "delete_bridge", bridge)
    monkeypatch.setattr(teardown.cgroups, "remove", lambda node_id, timeout=10.0: done.append(("cgroups", timeout)) or [])
    left = teardown.teardown(tmp_path, node_record)
    assert left == ["deleting the bridge: [Errno 1] Operation not permitted: 'drh-0123abcd'"]
    assert ("cgroups", 10.0) in done and "unmount" in done  # the steps after the failed one ran
    assert node_record.dirs.base.exists()  # a leftover keeps the directory for the next `down`


def test_teardown_all_without_real_nodes_touches_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(teardown.host, "release", lambda name: pytest.fail("released with no real node"))
    assert teardown.teardown_all(tmp_path, {"name": "c"}) == []


# --- noderuntime ----------------------------------------------------------------------------------


def _cni_dir(path: Path, plugins_present=noderuntime.CNI_PLUGINS) -> Path:
    path.mkdir(parents=True)
    for name in plugins_present:
        (path / name).write_bytes(b"\x7fELF")
    return path


def test_find_cni_dir(tmp_path):
    partial = _cni_dir(tmp_path / "partial", ("bridge", "host-local"))
    complete = _cni_dir(tmp_path / "complete")
    assert noderuntime.find_cni_dir((str(tmp_path / "absent"), str(partial), str(complete))) == complete
    assert noderuntime.find_cni_dir((str(partial),)) is None  # no loopback: pods would have no lo


def test_find_runc(tmp_path):
    runc = tmp_path / "sbin" / "runc"
    runc.parent.mkdir()
    runc.write_bytes(b"\x7fELF")
    candidates = (str(tmp_path / "bin" / "runc"), str(runc))
    assert noderuntime.find_runc(which=lambda name: None, candidates=candidates) == runc
    on_path = tmp_path / "path-runc"
    on_path.write_bytes(b"\x7fELF")
    assert noderuntime.find_runc(which=lambda name: str(on_path), candidates=candidates) == on_path  # PATH first
    assert noderuntime.find_runc(which=lambda name: None, candidates=()) is None


def test_host_tools_missing_names_each_tool():
    assert noderuntime.host_tools_missing(runc=None, cni_dir=None, busybox=None) == [
        "runc (the OCI runtime containerd starts containers with)",
        "CNI plugins bridge, host-local, loopback (in one of /usr/lib/cni, /opt/cni/bin, /usr/libexec/cni)",
        "a statically linked busybox (the test image's shell)"]


def test_host_tools_missing_when_complete(tmp_path):
    assert noderuntime.host_tools_missing(runc=tmp_path, cni_dir=tmp_path, busybox=tmp_path) == []


def test_ensure_fails_before_building_when_tools_are_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(noderuntime, "cache_dir", lambda version=None: pytest.fail("looked at the cache"))
    with pytest.raises(BinariesError) as caught:
        noderuntime.ensure(find_tools=lambda: (None, Path("/usr/lib/cni"), None))  # no runc, no busybox
    assert caught.value.message == ("a real node needs tools this machine lacks: "
                                    "runc (the OCI runtime containerd starts containers with); "
                                    "a statically linked busybox (the test image's shell)")
    assert caught.value.hint == "on Debian/Ubuntu: apt-get install runc containernetworking-plugins busybox-static"
    assert not (tmp_path / "cache").exists()


def test_the_built_runtime_needs_none_of_the_hosts_tools(tmp_path, monkeypatch):
    """The kind node image takes containerd and pause from here, runc and CNI from its own packages:
    a machine without runc, CNI plugins or busybox still builds them (it failed a cold kind run)."""
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(noderuntime, "find_host_tools", lambda: pytest.fail("looked for the host's tools"))
    monkeypatch.setattr(gobuild, "require_go", lambda: None)

    def go_install(packages, flags, cwd, work, reporter, title, verb="build", extra_env=None):
        for name in noderuntime.CONTAINERD_BINARIES:
            (Path(extra_env["GOBIN"]) / name).write_text(name)
    monkeypatch.setattr(gobuild, "run_go_build", go_install)
    monkeypatch.setattr(images, "build_pause", lambda out: out.write_text("pause") and out)
    directory = noderuntime.ensure_built()
    assert sorted(p.name for p in directory.iterdir() if p.name not in ("manifest.json", ".lock")) == \
        sorted([*noderuntime.CONTAINERD_BINARIES, noderuntime.PAUSE_BINARY])


def test_cache_dir_is_versioned(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(noderuntime, "host_platform", lambda: ("linux", "arm64"))
    assert noderuntime.cache_dir("2.4.2") == tmp_path / "binaries" / "containerd-v2.4.2_linux-arm64"


def test_node_runtime_path(tmp_path):
    assert _runtime(tmp_path).path("ctr") == tmp_path / "runtime" / "ctr"


# --- preflight ------------------------------------------------------------------------------------


ROOT_PROBLEM = ("a real node needs root (the kubelet and containerd mount filesystems, create cgroups, network "
                "namespaces and a bridge): run as root, or use --real-nodes 0 / the kind backend")


def _facts(**overrides) -> HostFacts:
    """A machine that passes every check (cgroup v1, overlayfs, every tool, room for the nodes);
    `overrides` break one thing at a time."""
    capable = HostFacts(system="Linux", euid=0,
                        cgroup_hierarchies=(Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup/memory")),
                        filesystems=frozenset({"sysfs", "overlay"}), missing_commands=(),
                        runc=Path("/usr/sbin/runc"), cni_dir=Path("/usr/lib/cni"), busybox=Path("/bin/busybox"),
                        read_only_sysctls=frozenset(),
                        inotify_limits={inotify.INSTANCES: 8192, inotify.WATCHES: 524288},
                        inotify_usage=inotify.Usage(instances=0, watches=0),
                        node_root=Path("/var/lib/dra-harness"), node_root_blocked_by=None)
    return replace(capable, **overrides)


def test_preflight_passes_on_a_capable_machine():
    assert _facts().cgroup_layout == "v1"
    assert preflight.problems_of(_facts()) == []


def test_preflight_needs_root():
    assert preflight.problems_of(_facts(euid=1000)) == [ROOT_PROBLEM]
    assert "root" in ROOT_PROBLEM and "--real-nodes 0" in ROOT_PROBLEM


def test_preflight_needs_linux():
    assert preflight.problems_of(_facts(system="Darwin")) == ["a real node needs Linux (this is Darwin)"]


def test_preflight_lists_every_problem(tmp_path):
    blocker = tmp_path / "file"
    facts = _facts(cgroup_hierarchies=(), filesystems=frozenset({"sysfs"}), missing_commands=("ip", "umount"),
                   runc=None, node_root=blocker / "nodes", node_root_blocked_by=blocker)
    assert preflight.problems_of(facts) == [
        "no cgroup hierarchy is mounted under /sys/fs/cgroup",
        "the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)",
        "`ip` is not installed (Debian: iproute2 / mount)",
        "`umount` is not installed (Debian: iproute2 / mount)",
        "missing: runc (the OCI runtime containerd starts containers with) "
        "(Debian: apt-get install runc containernetworking-plugins busybox-static)",
        f"cannot create the node directory root {blocker / 'nodes'} ({blocker} is not a writable directory; "
        f"set DRA_HARNESS_NODE_ROOT to a short writable path)"]


def test_preflight_read_only_sysctl():
    assert preflight.problems_of(_facts(read_only_sysctls=frozenset({"kernel.panic"}))) == [
        "/proc/sys/kernel/panic is read-only here: the kubelet must be able to set kernel.panic"]
    # the CNI plugin's forwarding switch is not the kubelet's to set: no problem of the preflight
    assert preflight.problems_of(_facts(read_only_sysctls=frozenset({"net.ipv4.ip_forward"}))) == []


def test_preflight_names_an_inotify_limit_it_cannot_raise():
    """120 of 128 instances are in use: one node and the control plane still to start (before `up` starts
    anything it counts too) need 32 more. Where the limit is writable host.acquire raises it."""
    crowded = _facts(inotify_limits={inotify.INSTANCES: 128, inotify.WATCHES: 524288},
                     inotify_usage=inotify.Usage(instances=120, watches=0))
    short = inotify.Shortfall(inotify.INSTANCES, limit=128, used=120,
                              needed=inotify.PER_NODE[inotify.INSTANCES] + inotify.CONTROL_PLANE[inotify.INSTANCES])
    assert str(short) not in preflight.problems_of(crowded, 1)  # root may raise it: host.acquire will
    read_only = replace(crowded, read_only_sysctls=frozenset({inotify.INSTANCES}))
    assert preflight.problems_of(read_only, 1) == [str(short)]
    assert str(short) not in preflight.problems_of(read_only, 0)


def test_two_machines_two_answers():
    """The answer is the facts' alone: the same call on a capable machine and on a user's laptop."""
    laptop = _facts(euid=1000, cgroup_hierarchies=(Path("/sys/fs/cgroup"),), filesystems=frozenset({"ext4"}),
                    runc=None, cni_dir=None)
    assert laptop.cgroup_layout == "v2"
    assert preflight.problems_of(_facts(), 2) == []
    assert preflight.problems_of(laptop, 2) == [
        ROOT_PROBLEM,
        "the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)",
        "missing: runc (the OCI runtime containerd starts containers with) "
        "(Debian: apt-get install runc containernetworking-plugins busybox-static)",
        "missing: CNI plugins bridge, host-local, loopback (in one of /usr/lib/cni, /opt/cni/bin, /usr/libexec/cni) "
        "(Debian: apt-get install runc containernetworking-plugins busybox-static)"]


def test_host_facts_read_from_a_fake_proc(tmp_path, monkeypatch):
    """The reader, against a /proc of the test's: each fact from where the checks used to look."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(HYBRID)
    (proc / "filesystems").write_text("nodev\tsysfs\nnodev\toverlay\n\text4\n")
    for name, value in {"kernel.panic": "0\n", "vm.overcommit_memory": "1\n", inotify.INSTANCES: "128\n"}.items():
        path = host.sysctl_path(name, proc / "sys")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
    host.sysctl_path("vm.overcommit_memory", proc / "sys").chmod(0o444)
    monkeypatch.setenv(layout.NODE_ROOT_ENV, str(tmp_path / "nodes"))
    without_umount = Runner(which=lambda name: None if name == "umount" else f"/usr/bin/{name}")

    facts = HostFacts.read(without_umount, proc=proc)
    assert (facts.system, facts.euid) == (platform.system(), os.geteuid())
    assert facts.cgroup_hierarchies == tuple(Path(f"/sys/fs/cgroup/{m}")
                                             for m in ("cpu,cpuacct", "memory", "systemd", "unified"))
    assert facts.cgroup_layout == "hybrid"
    assert facts.filesystems == {"sysfs", "overlay", "ext4"}
    assert facts.missing_commands == ("umount",)
    assert (facts.runc, facts.cni_dir, facts.busybox) == noderuntime.find_host_tools()  # this machine's
    # root may write a read-only file (os.access says so too); any other user may not
    assert facts.read_only_sysctls == (set() if os.geteuid() == 0 else {"vm.overcommit_memory"})
    assert facts.inotify_limits == {inotify.INSTANCES: 128}  # this kernel has no max_user_watches
    assert facts.inotify_usage == inotify.Usage(0, 0)  # no process in this /proc
    assert (facts.node_root, facts.node_root_blocked_by) == (tmp_path / "nodes", None)
    assert not (tmp_path / "nodes").exists()  # a check only: nothing is created

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(layout.NODE_ROOT_ENV, str(blocker / "nodes"))
    assert HostFacts.read(without_umount, proc=proc).node_root_blocked_by == blocker
    (tmp_path / "empty-proc").mkdir()
    bare = HostFacts.read(without_umount, proc=tmp_path / "empty-proc")
    assert (bare.cgroup_layout, bare.filesystems, bare.inotify_limits) == ("none", frozenset(), {})


def test_kubelet_restart_waits_for_the_nodes_other_users_and_needs_the_recorded_command_line(tmp_path):
    """A kubelet restart takes the node exclusively (another test's pods must not see it) and
    restarts exactly what was recorded; without a record it refuses before stopping anything."""
    (tmp_path / "node").mkdir()
    record = _record(tmp_path / "node")
    user = plugins.NodePlugins(tmp_path / "cluster", record, tmp_path / "kubeconfig")
    restarter = plugins.NodePlugins(tmp_path / "cluster", record, tmp_path / "kubeconfig")
    user.hold()  # what run() does: another test runs plugins on the node
    with pytest.raises(HarnessError, match="waited 0s for the other tests using real-node-0 to finish"):
        restarter.restart_kubelet(wait_for_others=0.3)
    user.close()
    with pytest.raises(HarnessError, match="cannot restart the kubelet of real-node-0: no usable record"):
        restarter.restart_kubelet(wait_for_others=0.3)
    restarter.close()


def test_legacy_device_plugins_of_a_test_hold_the_node_against_a_kubelet_restart(tmp_path):
    """A migration test runs device plugins, not kubelet plugins, on the node: it is a user all the same. A
    kubelet restarted under it forgot the plugin's PreStartRequired option (the checkpoint keeps devices only),
    and the test's outcome depended on another test's timing."""
    (tmp_path / "node").mkdir()
    record = _record(tmp_path / "node")
    user = plugins.NodePlugins(tmp_path / "cluster", record, tmp_path / "kubeconfig")
    restarter = plugins.NodePlugins(tmp_path / "cluster", record, tmp_path / "kubeconfig")
    migration_local.device_plugins_on(user)
    with pytest.raises(HarnessError, match="waited 0s for the other tests using real-node-0 to finish"):
        restarter.restart_kubelet(wait_for_others=0.3)
    user.close()
    restarter.close()


def test_plugin_argv_and_process_name_of_a_second_instance(tmp_path):
    record = _record(tmp_path)
    args = plugins.argv(record, "gpu.x.example.com", tmp_path / "kc", "fd0", "ns", rolling_update_id="v2")
    assert "--rolling-update-id=v2" in args
    assert "--rolling-update-id=v2" not in plugins.argv(record, "gpu.x.example.com", tmp_path / "kc", "fd0", "ns")
    assert plugins.process_name(record, "gpu.x.example.com", "v2") == "kubelet-plugin-real-node-0-gpu.x.example.com-v2"
    assert plugins.process_name(record, "gpu.x.example.com") == record.plugin_process("gpu.x.example.com")
