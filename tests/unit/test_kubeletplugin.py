"""The kubelet plugin's parts without a cluster: CDI specs, claim checks, checkpoint, health mapping,
prepare/unprepare semantics, and a gRPC server that survives malformed and oversize input."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import grpc
import pytest

from fake_devices import kube
from fake_devices.errors import InvalidInput
from fake_devices.kubeletplugin import __main__ as plugin_main
from fake_devices.kubeletplugin import cdi, claims, plugin, servicers
from fake_devices.kubeletplugin.cdi import AllocatedDevice, ClaimRef
from fake_devices.kubeletplugin.checkpoint import Checkpoint, CheckpointError
from fake_devices.kubeletplugin.config import DEFECTS, PluginConfig
from fake_devices.kubeletplugin.generated import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from fake_devices.kubeletplugin.health import HEALTHY, UNHEALTHY, UNKNOWN, HealthMonitor, assess
from fake_devices.kubeletplugin.prepare import Preparer

DRIVER, NODE = "gpu.test.example.com", "node-a"
UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
SHARE = "aa11bb22-cc33-dd44-ee55-ff6677889900"
GPU0 = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "model": {"string": "T4"},
                                         "uuid": {"string": "GPU-1"}, "index": {"int": 0},
                                         "migCapable": {"bool": False},
                                         "resource.kubernetes.io/numaNode": {"int": 1},
                                         "resource.kubernetes.io/pcieRoot": {"string": "pci0000:17"},
                                         "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"}},
        "capacity": {"memory": {"value": "16Gi"}}}


def node_selector(node: str) -> dict:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def claim(uid=UID, *, results=None, node=NODE, allocated=True, name="c", namespace="ns") -> dict:
    obj = {"metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": {}}
    if allocated:
        obj["status"]["allocation"] = {"devices": {"results": results if results is not None else [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}, "nodeSelector": node_selector(node)}
    return obj


def ref(uid=UID, name="c", namespace="ns") -> ClaimRef:
    return ClaimRef(namespace=namespace, name=name, uid=uid)


# --- CDI --------------------------------------------------------------------------------------

def test_list_attributes_reach_the_environment_comma_separated():
    attributes = {"numas": {"ints": [0, 1]}, "flags": {"bools": [True, False]}, "zones": {"strings": ["a", "b"]},
                  "fw": {"versions": ["1.2.3", "2.0.0"]}}
    spec, _ = cdi.build_spec(DRIVER, ref(), [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0", attributes, {})])
    env = set(spec["devices"][0]["containerEdits"]["env"])
    assert {"DRA_GPU_0_0F1E2D3C_ATTR_NUMAS=0,1", "DRA_GPU_0_0F1E2D3C_ATTR_FLAGS=true,false",
            "DRA_GPU_0_0F1E2D3C_ATTR_ZONES=a,b", "DRA_GPU_0_0F1E2D3C_ATTR_FW=1.2.3,2.0.0"} <= env, env


def test_cdi_spec_names_and_environment():
    devices = [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0", GPU0["attributes"], GPU0["capacity"]),
               AllocatedDevice("disk/fast", DRIVER, NODE, "nvme-0", {"model": {"string": "X"}}, {},
                               share_id=SHARE, consumed_capacity={"size": "100Gi"}, admin_access=True)]
    spec, ids = cdi.build_spec(DRIVER, ref(), devices)
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == f"{DRIVER}/gpu"
    assert ids == [f"{DRIVER}/gpu={UID}-gpu-0", f"{DRIVER}/gpu={UID}-nvme-0-{SHARE}"]
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-nvme-0-{SHARE}"]
    env = spec["devices"][0]["containerEdits"]["env"]
    assert env[:7] == ["DRA_GPU_0_0F1E2D3C_DEVICE=gpu-0", f"DRA_GPU_0_0F1E2D3C_POOL={NODE}",
                       f"DRA_GPU_0_0F1E2D3C_DRIVER={DRIVER}", "DRA_GPU_0_0F1E2D3C_REQUEST=gpu",
                       "DRA_GPU_0_0F1E2D3C_CLAIM=ns/c", f"DRA_GPU_0_0F1E2D3C_CLAIM_UID={UID}",
                       f"DRA_GPU_0_0F1E2D3C_CDI_DEVICE={ids[0]}"]
    assert {"DRA_GPU_0_0F1E2D3C_ATTR_NUMA_NODE=1", "DRA_GPU_0_0F1E2D3C_ATTR_PCIE_ROOT=pci0000:17",
            "DRA_GPU_0_0F1E2D3C_ATTR_PCI_BUS_ID=0000:18:00.0", "DRA_GPU_0_0F1E2D3C_ATTR_MIG_CAPABLE=false",
            "DRA_GPU_0_0F1E2D3C_ATTR_UUID=GPU-1", "DRA_GPU_0_0F1E2D3C_CAPACITY_MEMORY=16Gi"} <= set(env)
    share_env = spec["devices"][1]["containerEdits"]["env"]
    assert {f"DRA_NVME_0_0F1E2D3C_AA11BB22_SHARE_ID={SHARE}", "DRA_NVME_0_0F1E2D3C_AA11BB22_CONSUMED_SIZE=100Gi",
            "DRA_NVME_0_0F1E2D3C_AA11BB22_ADMIN_ACCESS=true", "DRA_NVME_0_0F1E2D3C_AA11BB22_REQUEST=disk/fast"} \
        <= set(share_env)
    names = [line.split("=", 1)[0] for line in env + share_env]
    assert len(names) == len(set(names)), "no two devices may set the same variable"
    assert all(cdi.valid_device_name(d["name"]) for d in spec["devices"])
    assert cdi.spec_file_name(DRIVER, UID) == f"{DRIVER}-gpu_{UID}.json"


def test_cdi_class_falls_back_when_the_first_label_is_not_a_cdi_name():
    assert cdi.kind("9gpu.example.com") == "9gpu.example.com/device"
    assert not cdi.valid_vendor("9gpu.example.com") and cdi.valid_vendor("gpu.example.com")
    assert cdi.attribute_token("other.example.com/fooBar", DRIVER) == "OTHER_EXAMPLE_COM_FOO_BAR"
    assert cdi.attribute_token(f"{DRIVER}/placementStart", DRIVER) == "PLACEMENT_START"


# --- claim checks -----------------------------------------------------------------------------

def no_labels() -> dict:
    raise AssertionError("labels are only read for matchExpressions")


@pytest.mark.parametrize("obj, message", [
    (claim(uid="other"), "has UID other, not " + UID),
    (claim(allocated=False), "ResourceClaim ns/c is not allocated"),
    (claim(results=[{"request": "r", "driver": "nic.x", "pool": NODE, "device": "nic-0"}]),
     f"has no devices of driver {DRIVER} (allocated: nic.x)"),
    (claim(results=[]), f"has no devices of driver {DRIVER} (allocated: no devices)"),
    (claim(node="node-b"), "is allocated for another node: its node selector [metadata.name In ['node-b']] does not "
                           f"select node {NODE}"),
])
def test_claims_that_are_not_ours_are_refused_with_the_reason(obj, message):
    with pytest.raises(claims.ClaimError, match=".*" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        claims.driver_results(obj, ref(), DRIVER, NODE, no_labels)


def test_node_selector_semantics():
    labels = lambda: {"zone": "a", "gpus": "8"}  # noqa: E731
    term = lambda *exprs: {"nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}  # noqa: E731
    assert claims.selects_node(term({"key": "zone", "operator": "In", "values": ["a", "b"]}), NODE, labels)
    assert not claims.selects_node(term({"key": "zone", "operator": "NotIn", "values": ["a"]}), NODE, labels)
    assert claims.selects_node(term({"key": "gpus", "operator": "Gt", "values": ["4"]}), NODE, labels)
    assert not claims.selects_node(term({"key": "missing", "operator": "Exists"}), NODE, labels)
    assert claims.selects_node(term({"key": "missing", "operator": "DoesNotExist"}), NODE, labels)
    assert not claims.selects_node({"nodeSelectorTerms": [{}]}, NODE, labels)  # an empty term selects nothing
    either = {"nodeSelectorTerms": node_selector("x")["nodeSelectorTerms"] + node_selector(NODE)["nodeSelectorTerms"]}
    assert claims.selects_node(either, NODE, no_labels)


@pytest.mark.parametrize("bad", [ref(uid=""), ref(uid="../../x"), ref(uid="a/b"), ref(namespace="Bad_NS"),
                                 ref(name=""), ref(uid="x" * 200)])
def test_malformed_references_are_refused(bad):
    with pytest.raises(claims.ClaimError, match="invalid claim reference"):
        claims.check_ref(bad)


# --- prepare / unprepare ----------------------------------------------------------------------

class StubInventory:
    def __init__(self, devices):
        self.devices = {(NODE, d["name"]): d for d in devices}

    def lookup(self, pool, device, refresh=True):
        return self.devices.get((pool, device))

    def pools(self):
        return {p for p, _ in self.devices}


class StubAPI:
    def __init__(self, *objs):
        self.claims = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
        self.reads = 0

    def read(self, namespace, name):
        self.reads += 1
        if (namespace, name) not in self.claims:
            raise kube.NotFound(status=404, reason="Not Found")  # what the client raises for a 404
        return json.loads(json.dumps(self.claims[(namespace, name)]))


@pytest.fixture
def preparer_for(tmp_path):
    def make(api: StubAPI, devices=(GPU0,), defects=()) -> Preparer:
        checkpoint = Checkpoint(tmp_path / "state" / "cp.json", DRIVER, NODE).load()
        return Preparer(DRIVER, NODE, tmp_path / "cdi", api.read, StubInventory(devices), checkpoint, no_labels,
                        defects=frozenset(defects))

    return make


def test_prepare_writes_a_spec_and_is_idempotent(preparer_for, tmp_path):
    api = StubAPI(claim())
    preparer = preparer_for(api)
    (result,) = preparer.prepare([ref(), ref()]).values()  # the same claim twice: one answer
    assert result.error == ""
    (device,) = result.devices
    assert (device.request_names, device.pool_name, device.device_name) == (["gpu"], NODE, "gpu-0")
    assert device.cdi_device_ids == [f"{DRIVER}/gpu={UID}-gpu-0"]
    spec_file = tmp_path / "cdi" / f"{DRIVER}-gpu_{UID}.json"
    content = spec_file.read_bytes()
    assert json.loads(content)["devices"][0]["name"] == f"{UID}-gpu-0"
    assert api.reads == 1
    assert preparer.prepare([ref()])[UID].devices == result.devices  # from the checkpoint, no API read
    assert api.reads == 1
    spec_file.unlink()
    assert preparer.prepare([ref()])[UID].error == ""
    assert spec_file.read_bytes() == content  # a lost spec is restored
    assert not [p for p in (tmp_path / "cdi").iterdir() if p.name.endswith(".tmp")]

    assert preparer.unprepare([ref(), ref(uid="never-prepared")]) == {UID: "", "never-prepared": ""}
    assert not spec_file.exists() and preparer.checkpoint.claims() == {}
    assert preparer.unprepare([ref()]) == {UID: ""}  # again: still fine


def test_a_restarted_preparer_knows_and_restores_prepared_claims(preparer_for, tmp_path):
    first = preparer_for(StubAPI(claim()))
    first.prepare([ref()])
    spec_file = first.spec_path(UID)
    spec_file.unlink()
    api = StubAPI()  # the claim is gone from the API: the checkpoint alone must do
    second = preparer_for(api)
    assert second.restore() == 1 and spec_file.exists()
    assert second.prepare([ref()])[UID].devices[0].device_name == "gpu-0"
    assert api.reads == 0
    assert second.unprepare([ref()]) == {UID: ""} and not spec_file.exists()


def test_failures_write_nothing(preparer_for, tmp_path):
    api = StubAPI(claim(uid="u1", name="unallocated", allocated=False),
                  claim(uid="u2", name="elsewhere", node="node-b"),
                  claim(uid="u3", name="unpublished", results=[
                      {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-7"}]))
    preparer = preparer_for(api)
    results = preparer.prepare([ref("u1", "unallocated"), ref("u2", "elsewhere"), ref("u3", "unpublished"),
                                ref("u4", "deleted"), ref("", "")])
    errors = {uid: r.error for uid, r in results.items()}
    assert errors["u1"] == "ResourceClaim ns/unallocated is not allocated"
    assert "allocated for another node" in errors["u2"]
    assert errors["u3"] == (f"ResourceClaim ns/unpublished: device {NODE}/gpu-7 is not published by driver {DRIVER} "
                            f"on node {NODE} (its pools here are {NODE})")
    assert errors["u4"] == "ResourceClaim ns/deleted not found: it was deleted (or never existed)"
    assert errors[""].startswith("invalid claim reference")
    assert all(not r.devices for r in results.values())
    assert not (tmp_path / "cdi").exists() or list((tmp_path / "cdi").iterdir()) == []
    assert preparer.checkpoint.claims() == {}


def test_an_unwritable_checkpoint_fails_the_claim_and_leaves_no_spec(preparer_for, tmp_path):
    preparer = preparer_for(StubAPI(claim()))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "cp.json").mkdir()  # a directory where the file should go: unreadable, rename fails
    result = preparer.prepare([ref()])[UID]
    assert "ResourceClaim ns/c" in result.error and f"checkpoint {tmp_path / 'state' / 'cp.json'}" in result.error
    (tmp_path / "state" / "cp.json").rmdir()
    assert not preparer.spec_path(UID).exists() and preparer.checkpoint.claims() == {}


# --- checkpoint -------------------------------------------------------------------------------

def test_checkpoint_round_trip_and_refusals(tmp_path):
    path = tmp_path / "cp.json"
    cp = Checkpoint(path, DRIVER, NODE).load()
    cp.put("u1", {"specFile": "/x", "spec": {}, "devices": []})
    assert Checkpoint(path, DRIVER, NODE).load().claims() == {"u1": {"specFile": "/x", "spec": {}, "devices": []}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json", "cp.json.lock"]  # no temporary files left
    with pytest.raises(CheckpointError, match="belongs to driver"):
        Checkpoint(path, "other.example.com", NODE).load()
    data = json.loads(path.read_text())
    data["claims"]["u1"]["specFile"] = "/tampered"
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        Checkpoint(path, DRIVER, NODE).load()
    path.write_text('{"claims": ')
    with pytest.raises(CheckpointError, match="is corrupt"):
        Checkpoint(path, DRIVER, NODE).load()


# --- health -----------------------------------------------------------------------------------

def test_health_mapping():
    devices = [(NODE, n) for n in ("gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5",
                                   "gpu-1-mig-1g.10gb-0", "gpu-6")]
    published = set(devices) - {(NODE, "gpu-4"), (NODE, "gpu-6")}
    faults = {"gpu-1": "warning", "gpu-2": "degraded", "gpu-3": "unhealthy", "gpu-4": "lost"}
    got = assess(devices, published, faults, "cm")
    health = {name: h for (_, name), (h, _) in got.items()}
    assert health == {"gpu-0": HEALTHY, "gpu-1": HEALTHY, "gpu-2": HEALTHY, "gpu-3": UNHEALTHY, "gpu-4": UNHEALTHY,
                      "gpu-5": HEALTHY, "gpu-1-mig-1g.10gb-0": HEALTHY, "gpu-6": UNKNOWN}
    assert "inherited from gpu-1" in got[(NODE, "gpu-1-mig-1g.10gb-0")][1]
    assert "lost" in got[(NODE, "gpu-4")][1] and "degraded" in got[(NODE, "gpu-2")][1]
    assert all(h == UNKNOWN for h, _ in assess(devices, published, None, "cm").values())


def test_health_monitor_versions_and_timestamps():
    now = [1000.0]
    monitor = HealthMonitor(lambda: [(NODE, "gpu-0"), (NODE, "gpu-1")], lambda: {(NODE, "gpu-0"), (NODE, "gpu-1")},
                            "cm", clock=lambda: now[0])
    monitor.set_faults({})
    version, entries = monitor.snapshot()
    assert [(e.device, e.health, e.since) for e in entries] == [("gpu-0", HEALTHY, 1000), ("gpu-1", HEALTHY, 1000)]
    now[0] = 2000.0
    monitor.set_faults({})  # nothing changed: same version
    assert monitor.snapshot()[0] == version
    monitor.set_faults({"gpu-1": "unhealthy"})
    version2, entries = monitor.snapshot()
    assert version2 != version
    assert [(e.device, e.health, e.since) for e in entries] == [("gpu-0", HEALTHY, 1000), ("gpu-1", UNHEALTHY, 2000)]


# --- configuration ----------------------------------------------------------------------------

def test_config_refuses_what_cannot_work():
    with pytest.raises(InvalidInput) as err:
        PluginConfig(driver="9bad_driver", node="Node_A", plugins_dir=Path("/tmp/" + "x" * 120),
                     health_interval=0).validate()
    text = str(err.value)
    for flag in ("--driver", "--node", "--plugins-dir", "--health-interval"):
        assert flag in text
    config = PluginConfig(driver=DRIVER, node=NODE).validate()
    assert str(config.dra_socket) == f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock"
    assert str(config.registration_socket) == f"/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"


# --- the gRPC server under malformed input ----------------------------------------------------

@pytest.fixture
def dra_server(preparer_for):
    base = Path(tempfile.mkdtemp(prefix="kpu-", dir="/tmp"))  # short: socket paths are limited
    monitor = HealthMonitor(lambda: [(NODE, "gpu-0")], lambda: {(NODE, "gpu-0")}, "cm")
    monitor.set_faults({})
    server = plugin.new_server(max_message_bytes=64 * 1024, workers=4)
    servicers.add_dra_services(server, preparer_for(StubAPI(claim())), monitor, interval=30)
    path = plugin.serve_unix(server, base / "dra.sock")
    yield path, monitor
    monitor.close()
    plugin.stop_server(server, path)
    assert not path.exists()
    shutil.rmtree(base)


def _prepare_ok(channel) -> None:
    answer = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(namespace="ns", name="c", uid=UID)]), timeout=10)
    assert answer.claims[UID].error == "" and answer.claims[UID].devices[0].device_name == "gpu-0"


def test_server_survives_malformed_and_oversize_input(dra_server):
    path, _ = dra_server
    with grpc.insecure_channel(f"unix:{path}") as channel:
        method = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
        raw = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", timeout=10)  # a length that runs past the end
        assert err.value.code() == grpc.StatusCode.INTERNAL
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\x0a" + b"\x80\x80\x08" + b"x" * (128 * 1024), timeout=10)  # over the 64 KiB limit
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NoSuchMethod")(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        rng = random.Random(4)
        for _ in range(300):  # random bytes: an answer or an error status, never a dead server
            try:
                raw(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), timeout=10)
            except grpc.RpcError as error:
                assert error.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
        # Well-formed protobuf with garbage in it: per-claim errors, not a failed call.
        weird = [dra_v1_pb2.Claim(namespace="../..", name="\x00\xff", uid="/etc/passwd"),
                 dra_v1_pb2.Claim(), dra_v1_pb2.Claim(namespace="ns", name="c" * 300, uid="u" * 127)]
        answer = dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=weird), timeout=10)
        assert len(answer.claims) == 3 and all("invalid claim reference" in c.error for c in answer.claims.values())
    # Not even HTTP/2: junk straight onto the socket.
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096), b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
            sock.sendall(junk)
    with grpc.insecure_channel(f"unix:{path}") as channel:
        _prepare_ok(channel)


def test_v1beta1_answers_without_share_ids_and_health_streams_changes(dra_server):
    path, monitor = dra_server
    with grpc.insecure_channel(f"unix:{path}") as channel:
        answer = dra_v1beta1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[dra_v1beta1_pb2.Claim(namespace="ns", name="c", uid=UID)]),
            timeout=10)
        assert [d.device_name for d in answer.claims[UID].devices] == ["gpu-0"]
        stream = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=30)
        first = next(stream)
        assert [(d.device.device_name, d.health) for d in first.devices] == [("gpu-0", dra_health_v1alpha1_pb2.HEALTHY)]
        assert first.devices[0].health_check_timeout_seconds == 90 and first.devices[0].last_updated_time > 0
        threading.Timer(0.2, monitor.set_faults, args=({"gpu-0": "lost"},)).start()
        second = next(stream)  # pushed on the change, long before the 30 s resend
        assert [(d.device.device_name, d.health) for d in second.devices] == [("gpu-0", dra_health_v1alpha1_pb2.UNHEALTHY)]
        assert "lost" in second.devices[0].message
        monitor.close()  # plugin stopping: the stream ends
        assert list(stream) == []


def test_opaque_configs_of_this_driver_reach_the_environment(preparer_for):
    obj = claim()
    obj["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"mode": "shared"}}},
        {"source": "FromClaim", "requests": ["other"], "opaque": {"driver": DRIVER, "parameters": {"x": 1}}},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "nic.other", "parameters": {"y": 2}}},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {"z": [3]}}}]
    preparer = preparer_for(StubAPI(obj))
    assert preparer.prepare([ref()])[UID].error == ""
    env = json.loads(preparer.spec_path(UID).read_text())["devices"][0]["containerEdits"]["env"]
    assert [e for e in env if "_CONFIG" in e] == ['DRA_GPU_0_0F1E2D3C_CONFIG_0={"mode":"shared"}',
                                                  'DRA_GPU_0_0F1E2D3C_CONFIG_0_SOURCE=FromClass',
                                                  'DRA_GPU_0_0F1E2D3C_CONFIG_1={"z":[3]}',
                                                  'DRA_GPU_0_0F1E2D3C_CONFIG_1_SOURCE=FromClaim',
                                                  'DRA_GPU_0_0F1E2D3C_CONFIG={"mode":"shared","z":[3]}']


def test_claim_config_overrides_class_config_whatever_the_order(preparer_for):
    obj = claim()
    obj["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"mode": "exclusive", "claim": "yes"}}},
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"mode": "shared", "class": "yes"}}},
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": ["not", "an", "object"]}}]
    preparer = preparer_for(StubAPI(obj))
    assert preparer.prepare([ref()])[UID].error == ""
    env = dict(e.split("=", 1) for e in json.loads(preparer.spec_path(UID).read_text())["devices"][0]
               ["containerEdits"]["env"])
    prefix = "DRA_GPU_0_0F1E2D3C_CONFIG"
    assert [env[f"{prefix}_{i}_SOURCE"] for i in range(3)] == ["FromClass", "FromClaim", "FromClaim"]
    assert env[f"{prefix}_2"] == '["not","an","object"]'  # shown, but not merged
    assert json.loads(env[prefix]) == {"mode": "exclusive", "class": "yes", "claim": "yes"}


def test_checkpoint_shared_by_two_instances_keeps_both_changes(tmp_path):
    """A rolling update runs two plugin instances on one checkpoint: each sees the other's changes
    and neither overwrites the other's entry."""
    path = tmp_path / "cp.json"
    old, new = Checkpoint(path, DRIVER, NODE).load(), Checkpoint(path, DRIVER, NODE).load()
    old.put("u1", {"specFile": "/1", "spec": {}, "devices": []})
    assert new.get("u1") == {"specFile": "/1", "spec": {}, "devices": []}  # prepared by the old one
    new.put("u2", {"specFile": "/2", "spec": {}, "devices": []})
    old.put("u3", {"specFile": "/3", "spec": {}, "devices": []})  # the old one has not read u2 yet
    assert set(Checkpoint(path, DRIVER, NODE).load().claims()) == {"u1", "u2", "u3"}
    assert new.delete("u1") and old.get("u1") is None  # unprepared through the new one
    assert set(old.claims()) == set(new.claims()) == {"u2", "u3"}


def test_rolling_update_instances_get_their_own_socket_names(tmp_path):
    """Two instances of one driver registered at once need distinct endpoints: the kubelet refuses a
    second registration of the same one (dra_plugin_manager.go `add`)."""
    first = PluginConfig(driver=DRIVER, node=NODE, plugins_dir=tmp_path / "p", registry_dir=tmp_path / "r").validate()
    second = PluginConfig(driver=DRIVER, node=NODE, plugins_dir=tmp_path / "p", registry_dir=tmp_path / "r",
                          rolling_update_id="v2").validate()
    assert first.registration_socket.name == f"{DRIVER}-reg.sock" and first.dra_socket.name == "dra.sock"
    assert second.registration_socket.name == f"{DRIVER}-v2-reg.sock" and second.dra_socket.name == "dra-v2.sock"
    assert first.plugin_dir == second.plugin_dir and first.state_path == second.state_path  # shared state
    with pytest.raises(InvalidInput, match="--rolling-update-id"):
        PluginConfig(driver=DRIVER, node=NODE, rolling_update_id="Not/An/Id").validate()


# --- deliberate defects (self-tests) ----------------------------------------------------------

def test_defects_are_known_by_name():
    names = [name for name, _ in DEFECTS]
    assert names == ["stale-cdi", "keep-cdi", "unprepare-unknown-fails", "drop-claim", "any-node", "silent-health",
                     "wrong-pool", "all-requests"]
    args = plugin_main.parse_args(["--driver", DRIVER, "--node", NODE, "--defect", "keep-cdi", "--defect", "any-node"])
    assert args.defect == ["keep-cdi", "any-node"]
    assert plugin_main.parse_args(["--driver", DRIVER, "--node", NODE]).defect == []
    with pytest.raises(SystemExit):
        plugin_main.parse_args(["--driver", DRIVER, "--node", NODE, "--defect", "no-such-defect"])
    with pytest.raises(InvalidInput, match="--defect"):
        PluginConfig(driver=DRIVER, node=NODE, defects=frozenset({"no-such-defect"})).validate()


def test_defect_stale_cdi_answers_without_restoring_the_spec(preparer_for):
    preparer = preparer_for(StubAPI(claim()), defects={"stale-cdi"})
    first = preparer.prepare([ref()])[UID]
    preparer.spec_path(UID).unlink()
    again = preparer.prepare([ref()])[UID]
    assert again.error == "" and again.devices == first.devices
    assert not preparer.spec_path(UID).exists()  # the kubelet is told the claim is ready; the runtime finds no spec


def test_defect_keep_cdi_leaves_the_spec_behind(preparer_for):
    preparer = preparer_for(StubAPI(claim()), defects={"keep-cdi"})
    assert preparer.prepare([ref()])[UID].error == ""
    assert preparer.unprepare([ref()]) == {UID: ""}
    assert preparer.checkpoint.claims() == {} and preparer.spec_path(UID).exists()


def test_defect_unprepare_unknown_fails(preparer_for):
    preparer = preparer_for(StubAPI(claim()), defects={"unprepare-unknown-fails"})
    assert preparer.unprepare([ref(uid="never-prepared")]) == {"never-prepared": "claim not prepared"}
    assert preparer.prepare([ref()])[UID].error == ""
    assert preparer.unprepare([ref()]) == {UID: ""}  # a prepared claim still unprepares
    assert preparer.unprepare([ref()]) == {UID: "claim not prepared"}  # but not twice


def test_defect_drop_claim_leaves_the_last_claim_out(preparer_for):
    other = "11111111-2222-3333-4444-555555555555"
    api = StubAPI(claim(), claim(uid=other, name="d"))
    preparer = preparer_for(api, defects={"drop-claim"})
    assert list(preparer.prepare([ref(), ref(uid=other, name="d")])) == [UID]
    assert preparer.checkpoint.get(other) is not None  # prepared all the same, just not answered
    assert list(preparer.prepare([ref(uid=other, name="d")])) == [other]  # one claim: answered
    assert list(preparer_for(api).prepare([ref(), ref(uid=other, name="d")])) == [UID, other]


def test_defect_any_node_prepares_what_is_not_ours(preparer_for):
    elsewhere = claim(node="node-b", results=[{"request": "gpu", "driver": DRIVER, "pool": "node-b",
                                               "device": "gpu-9"}])
    correct = preparer_for(StubAPI(elsewhere)).prepare([ref()])[UID]
    assert "is allocated for another node" in correct.error
    (result,) = preparer_for(StubAPI(elsewhere), defects={"any-node"}).prepare([ref()]).values()
    assert result.error == ""
    assert [(d.pool_name, d.device_name) for d in result.devices] == [("node-b", "gpu-9")]
    spec = json.loads(preparer_for(StubAPI()).spec_path(UID).read_text())
    assert spec["devices"][0]["name"] == f"{UID}-gpu-9"


def test_defect_wrong_pool_answers_another_pool(preparer_for):
    preparer = preparer_for(StubAPI(claim()), defects={"wrong-pool"})
    (device,) = preparer.prepare([ref()])[UID].devices
    assert (device.pool_name, device.device_name) == (f"{NODE}-x", "gpu-0")
    assert preparer.prepare([ref()])[UID].devices == [device]  # from the checkpoint: the same wrong answer
    env = json.loads(preparer.spec_path(UID).read_text())["devices"][0]["containerEdits"]["env"]
    assert f"DRA_GPU_0_0F1E2D3C_POOL={NODE}" in env  # only the answer to the kubelet is wrong


def test_defect_all_requests_answers_no_request_names(preparer_for):
    preparer = preparer_for(StubAPI(claim()), defects={"all-requests"})  # without it: ["gpu"] (see above)
    (device,) = preparer.prepare([ref()])[UID].devices
    assert (device.request_names, device.device_name) == ([], "gpu-0")  # "associated with all requests"


def test_defect_silent_health_keeps_the_streams_open_and_empty(preparer_for):
    base = Path(tempfile.mkdtemp(prefix="kpu-", dir="/tmp"))
    monitor = HealthMonitor(lambda: [(NODE, "gpu-0")], lambda: {(NODE, "gpu-0")}, "cm")
    monitor.set_faults({})
    server = plugin.new_server(max_message_bytes=64 * 1024, workers=4)
    servicers.add_dra_services(server, preparer_for(StubAPI(claim())), monitor, interval=0.2, silent_health=True)
    path = plugin.serve_unix(server, base / "dra.sock")
    try:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            for stub, pb2 in ((dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel), dra_health_v1_pb2),
                              (dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel), dra_health_v1alpha1_pb2)):
                stream = stub.NodeWatchResources(pb2.NodeWatchResourcesRequest(), timeout=1.5)
                threading.Timer(0.3, monitor.set_faults, args=({"gpu-0": "unhealthy"},)).start()
                with pytest.raises(grpc.RpcError) as err:
                    next(stream)  # not even on a change or after several intervals
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # open until the client gave up
                monitor.set_faults({})
            _prepare_ok(channel)  # the rest still works
    finally:
        monitor.close()
        plugin.stop_server(server, path)
        shutil.rmtree(base)
