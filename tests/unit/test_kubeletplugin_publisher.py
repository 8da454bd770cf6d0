"""The kubelet plugin publishing its own node's slices (`--publish-profile`), against a fake API: the
generation it picks, create vs replace, stale slices deleted, errors that name the slice, and a plugin
that publishes before its sockets appear and reports health without a fault ConfigMap."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import grpc
import kubernetes
import pytest

from fake_devices import profile as profiles
from fake_devices import render
from fake_devices.errors import InvalidInput
from fake_devices.kubeletplugin import plugin
from fake_devices.kubeletplugin.config import PluginConfig
from fake_devices.kubeletplugin.generated import dra_health_v1_pb2, dra_health_v1_pb2_grpc
from fake_devices.kubeletplugin.publisher import PUBLISHER_INSTANCE, PublishError, SlicePublisher
from harness.k8s import errors

DOMAIN, NODE = "test.example.com", "node-a"
GPU, NIC = f"gpu.{DOMAIN}", f"nic.{DOMAIN}"
NODE_UID = "5b9e0c1a-0000-4000-8000-000000000001"


def api_error(status: int, reason: str, body: dict | None = None) -> errors.ApiError:
    err = errors.from_status(status, reason)  # typed by status, as the client raises it
    err.body = json.dumps(body) if body else None
    return err


class FakeResource:
    """The part of ResourceV1Api the publisher uses, over a dict of raw slices."""

    def __init__(self, *slices: dict):
        self.slices: dict[str, dict] = {}
        self.calls: list[tuple] = []
        self.refuse: dict[str, errors.ApiError] = {}  # slice name -> error of its write
        self.on_write = lambda: None
        self._version = 100
        for obj in slices:
            self._store(obj)

    def _store(self, body: dict) -> None:
        self._version += 1
        obj = json.loads(json.dumps(body))
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.slices[obj["metadata"]["name"]] = obj

    def list_resource_slice(self, field_selector: str, _preload_content: bool, _request_timeout: float):
        assert not _preload_content
        wanted = dict(term.split("=", 1) for term in field_selector.split(","))
        items = [s for s in self.slices.values()
                 if s["spec"]["driver"] == wanted["spec.driver"] and s["spec"]["nodeName"] == wanted["spec.nodeName"]]
        return SimpleNamespace(data=json.dumps({"items": items}).encode())

    def create_resource_slice(self, body: dict, **_):
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        self.on_write()
        if name in self.refuse:
            raise self.refuse[name]
        if name in self.slices:
            raise api_error(409, "Conflict")
        self._store(body)

    def replace_resource_slice(self, name: str, body: dict, **_):
        self.calls.append(("replace", name, body["metadata"].get("resourceVersion")))
        self.on_write()
        if name in self.refuse:
            raise self.refuse[name]
        if body["metadata"].get("resourceVersion") != self.slices[name]["metadata"]["resourceVersion"]:
            raise api_error(409, "Conflict")
        self._store(body)

    def delete_resource_slice(self, name: str, **_):
        self.calls.append(("delete", name))
        if self.slices.pop(name, None) is None:
            raise api_error(404, "Not Found")


class FakeCore:
    def __init__(self, nodes=(NODE,), labels: dict | None = None):
        self.nodes, self.labels = set(nodes), labels or {}

    def read_node(self, name: str, **_):
        if name not in self.nodes:
            raise api_error(404, "Not Found")
        return SimpleNamespace(metadata=SimpleNamespace(name=name, uid=NODE_UID, labels=dict(self.labels)))


def rendered(profile: str, driver: str = GPU, node: str = NODE, generation: int = 1) -> list[dict]:
    return render.render_node(profiles.load(profile), node, render.Drivers(DOMAIN), generation=generation,
                              instance="other")[driver]


def publisher(resource: FakeResource, driver: str = GPU, profile: str = "gpu-4", core=None) -> SlicePublisher:
    return SlicePublisher(resource, core or FakeCore(), driver, NODE, profile)


def test_first_publish_creates_generation_1_of_this_driver_only():
    resource = FakeResource()
    assert publisher(resource, profile="tiny").publish() == 1
    assert [c[0] for c in resource.calls] == ["create"]  # tiny has GPUs, storage and NICs: only the GPUs
    (obj,) = resource.slices.values()
    assert obj["spec"]["driver"] == GPU and obj["spec"]["nodeName"] == NODE
    assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert obj["metadata"]["name"] == render.slice_name(NODE, GPU, 0)
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                   "uid": NODE_UID, "controller": True}]
    assert obj["metadata"]["labels"]["dra-harness.x-k8s.io/fake-driver-instance"] == PUBLISHER_INSTANCE
    assert [d["name"] for d in obj["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_republish_raises_the_generation_replaces_by_name_and_deletes_stale_slices():
    old = rendered("a100-mig", generation=3)  # three slices; gpu-4 yields one, with the first one's name
    other_driver = rendered("tiny", driver=NIC, generation=7)
    other_node = rendered("gpu-4", node="node-b", generation=9)
    resource = FakeResource(*old, *other_driver, *other_node)
    first_version = resource.slices[old[0]["metadata"]["name"]]["metadata"]["resourceVersion"]
    assert publisher(resource).publish() == 4  # above the newest generation of this driver on this node
    names = [s["metadata"]["name"] for s in old]
    assert resource.calls == [("replace", names[0], first_version), ("delete", names[1]), ("delete", names[2])]
    assert resource.slices[names[0]]["spec"]["pool"]["generation"] == 4
    assert len(resource.slices[names[0]]["spec"]["devices"]) == 4
    kept = {s["metadata"]["name"] for s in other_driver + other_node}
    assert kept <= set(resource.slices)  # other drivers and nodes are not ours
    assert publisher(resource).publish() == 5  # again (a restart): the next generation, nothing deleted
    assert [c[0] for c in resource.calls[3:]] == ["replace"]


def test_a_profile_without_devices_of_the_driver_is_an_error():
    resource = FakeResource()
    with pytest.raises(PublishError, match=f"profile gpu-4 yields no ResourceSlices for driver {NIC}"):
        publisher(resource, driver=NIC).publish()
    with pytest.raises(PublishError, match="yields no ResourceSlices for driver vendor.example.com"):
        publisher(resource, driver="vendor.example.com").publish()
    assert resource.slices == {}
    with pytest.raises(InvalidInput, match="no such profile"):
        publisher(resource, profile="no-such-profile")


def test_api_errors_name_the_slice():
    resource = FakeResource()
    name = render.slice_name(NODE, GPU, 0)
    resource.refuse[name] = api_error(422, "Unprocessable Entity", {
        "kind": "Status", "message": f'ResourceSlice.resource.k8s.io "{name}" is invalid: spec.devices[0]: bad',
        "details": {"causes": [{"field": "spec.devices[0]", "message": "bad"}]}})
    with pytest.raises(PublishError) as err:
        publisher(resource).publish()
    text = str(err.value)
    assert f"ResourceSlice {name} (node {NODE}, driver {GPU})" in text
    assert "422 Unprocessable Entity" in text and "spec.devices[0]" in text
    with pytest.raises(PublishError, match=f"node {NODE} not found"):
        publisher(FakeResource(), core=FakeCore(nodes=())).publish()


# --- in the plugin ----------------------------------------------------------------------------

class SlicesInventory:
    """The plugin's inventory, read straight from the fake API's slices."""

    def __init__(self, resource: FakeResource):
        self.resource = resource
        self.last_error = None

    def start(self):
        return self

    def wait_synced(self, timeout):
        return True

    def stop(self):
        pass

    def devices(self):
        return {(s["spec"]["pool"]["name"], d["name"]): d for s in self.resource.slices.values()
                if s["spec"]["driver"] == GPU and s["spec"]["nodeName"] == NODE for d in s["spec"].get("devices", [])}

    def seen(self):
        return list(self.devices())

    def lookup(self, pool, device, refresh=True):
        return self.devices().get((pool, device))

    def pools(self):
        return {pool for pool, _ in self.devices()}


@pytest.fixture
def short_dir():
    base = Path(tempfile.mkdtemp(prefix="kpp-", dir="/tmp"))  # short: socket paths are limited
    yield base
    shutil.rmtree(base)


def test_plugin_publishes_before_serving_and_is_healthy_without_a_fault_configmap(short_dir):
    config = PluginConfig(driver=GPU, node=NODE, plugins_dir=short_dir / "p", registry_dir=short_dir / "r",
                          cdi_dir=short_dir / "cdi", publish_profile="gpu-4")  # no --instance, no --profile
    kubelet_plugin = plugin.KubeletPlugin(config, kubernetes.client.ApiClient())
    resource = FakeResource()
    sockets_at_write = []
    resource.on_write = lambda: sockets_at_write.append(config.dra_socket.exists()
                                                        or config.registration_socket.exists())
    kubelet_plugin.resource, kubelet_plugin.core = resource, FakeCore()
    kubelet_plugin.inventory = kubelet_plugin.preparer.inventory = SlicesInventory(resource)  # type: ignore
    with kubelet_plugin:
        assert sockets_at_write == [False]  # published while neither socket existed yet
        assert kubelet_plugin._profile_devices == [(NODE, f"gpu-{i}") for i in range(4)]  # --profile defaulted
        with grpc.insecure_channel(f"unix:{config.dra_socket}") as channel:
            stream = dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                dra_health_v1_pb2.NodeWatchResourcesRequest(), timeout=30)
            first = next(stream)
            assert [(d.device.device_name, d.health) for d in first.devices] == \
                [(f"gpu-{i}", dra_health_v1_pb2.HEALTHY) for i in range(4)]
            assert {d.message for d in first.devices} == {"no fault injected"}
            stream.cancel()
    assert not config.dra_socket.exists() and not config.registration_socket.exists()


def test_plugin_does_not_serve_when_publishing_fails(short_dir):
    config = PluginConfig(driver=NIC, node=NODE, plugins_dir=short_dir / "p", registry_dir=short_dir / "r",
                          cdi_dir=short_dir / "cdi", publish_profile="gpu-4")
    kubelet_plugin = plugin.KubeletPlugin(config, kubernetes.client.ApiClient())
    kubelet_plugin.resource, kubelet_plugin.core = FakeResource(), FakeCore()
    with pytest.raises(plugin.PluginError, match=f"profile gpu-4 yields no ResourceSlices for driver {NIC}"):
        kubelet_plugin.start()
    assert not config.dra_socket.exists() and not config.registration_socket.exists()
