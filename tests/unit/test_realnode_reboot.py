"""A real node's reboot (harness/backends/local/realnode/reboot.py) as logic: what it kills, empties and keeps,
and what it starts again with which command line. Processes, mounts and readiness are replaced by recorded
calls; the node directory is a tmp directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.backends.local.realnode import reboot
from harness.core.errors import HarnessError
from harness.core.nodelayout import RealNodeRecord


def _record(directory: Path) -> RealNodeRecord:
    return RealNodeRecord(name="real-node-0", id="0123abcd", directory=str(directory), bridge="drh-0123abcd",
                          subnet="10.202.41.0/24", address="10.202.41.1", kubelet_port=20001, healthz_port=20002)


def _recorded(cluster_dir: Path, name: str, argv: list[str], env: dict | None = None) -> None:
    (cluster_dir / "pids").mkdir(parents=True, exist_ok=True)
    (cluster_dir / "pids" / f"{name}.json").write_text(json.dumps({"pid": 1, "argv": argv, "env": env or {}}))


@pytest.fixture
def calls(monkeypatch) -> list[tuple]:
    seen: list[tuple] = []
    monkeypatch.setattr(reboot.process, "stop_named",
                        lambda cluster_dir, names, grace_seconds: seen.append(("kill", *names, grace_seconds)) or [])
    monkeypatch.setattr(reboot, "_kill_containers", lambda record: seen.append(("kill containers", record.id)))
    monkeypatch.setattr(reboot.teardown, "processes_mentioning", lambda base: ["shim"])
    monkeypatch.setattr(reboot.process, "terminate", lambda procs, grace: seen.append(("terminate", procs)) or [])
    monkeypatch.setattr(reboot.teardown, "unmount_all", lambda base: seen.append(("unmount", Path(base))) or [])
    monkeypatch.setattr(reboot.process, "start",
                        lambda name, argv, cluster_dir, env=None: seen.append(("start", name, argv, env)) or name)
    monkeypatch.setattr(reboot.node, "wait_ready",
                        lambda ready, running, timeout, what, during="start": seen.append(("ready", running, during)))
    return seen


def test_reboot_empties_the_tmpfs_places_keeps_the_disks_and_boots_with_the_recorded_commands(tmp_path, calls):
    cluster_dir, record = tmp_path / "cluster", _record(tmp_path / "node")
    dirs = record.dirs
    _recorded(cluster_dir, record.kubelet_process, ["kubelet", "--root-dir", str(dirs.kubelet_root)])
    _recorded(cluster_dir, record.containerd_process, ["containerd", "--config", "c.toml"], {"PATH": "/rt"})
    tmpfs = [dirs.containerd_state / "io.containerd.runtime.v2.task" / "k8s.io", dirs.runc_root / "k8s.io",
             dirs.cdi / "gpu.example.com-claim.json", dirs.cni_ipam / "net" / "10.202.41.5"]
    disks = [dirs.containerd_root / "io.containerd.metadata.v1.bolt" / "meta.db",
             dirs.kubelet_root / "dra_manager_state", dirs.plugins / "gpu.example.com" / "checkpoint.json"]
    for path in tmpfs + disks:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    dirs.containerd_socket.write_text("")  # a stale socket of the killed containerd

    reboot.reboot(cluster_dir, record)

    assert [p for p in tmpfs if p.exists()] == [] and not dirs.containerd_socket.exists()
    assert all(directory.is_dir() for directory in (dirs.containerd_state, dirs.runc_root, dirs.cdi, dirs.cni_ipam))
    assert all(p.read_text() == "x" for p in disks)
    assert calls == [
        ("kill", record.kubelet_process, 0), ("kill containers", record.id), ("kill", record.containerd_process, 0),
        ("terminate", ["shim"]), ("unmount", dirs.base),
        ("start", record.containerd_process, ["containerd", "--config", "c.toml"], {"PATH": "/rt"}),
        ("ready", record.containerd_process, "boot after a reboot"),
        ("start", record.kubelet_process, ["kubelet", "--root-dir", str(dirs.kubelet_root)], {}),
        ("ready", record.kubelet_process, "boot after a reboot")]


def test_reboot_without_a_record_of_the_kubelet_changes_nothing(tmp_path, calls):
    cluster_dir, record = tmp_path / "cluster", _record(tmp_path / "node")
    _recorded(cluster_dir, record.containerd_process, ["containerd"])
    record.dirs.cdi.mkdir(parents=True)
    (record.dirs.cdi / "spec.json").write_text("{}")
    with pytest.raises(HarnessError, match=f"cannot reboot real-node-0: no usable record of {record.kubelet_process}"):
        reboot.reboot(cluster_dir, record)
    assert calls == [] and (record.dirs.cdi / "spec.json").exists()


def test_reboot_stops_when_a_process_survives(tmp_path, calls, monkeypatch):
    cluster_dir, record = tmp_path / "cluster", _record(tmp_path / "node")
    _recorded(cluster_dir, record.kubelet_process, ["kubelet"])
    _recorded(cluster_dir, record.containerd_process, ["containerd"])
    monkeypatch.setattr(reboot.process, "terminate", lambda procs, grace: procs)
    monkeypatch.setattr(reboot.process, "describe", lambda procs: "pid 7 (containerd-shim)")
    with pytest.raises(HarnessError, match=r"rebooting real-node-0: pid 7 \(containerd-shim\) survived SIGKILL"):
        reboot.reboot(cluster_dir, record)
    assert not any(call[0] == "start" for call in calls)
