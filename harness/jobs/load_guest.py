"""A load run on a cluster dra-harness did not start (`load run --backend existing --kubeconfig K`).

The run brings everything its scenario acts on and changes nothing that was there before:

- its own Node objects `load-<id>-dev-0..N-1` (labelled `dra-harness.x-k8s.io/load=load-<id>`,
  tainted NoSchedule with that key so no other pod is scheduled there, annotated for KWOK so a
  cluster running KWOK keeps them Ready; without a kubelet or KWOK they stay NotReady, and the run's
  pods tolerate the node lifecycle taints: only binding is measured);
- its own fake-driver instance `load-<id>` (domain `load-<id>.example.com`, profile `load-gpu-<id>`),
  run in this process, which publishes ResourceSlices for the run's nodes only and creates its own
  DeviceClass;
- its own namespace `load-<scenario>-<id>`, where the locust file creates every pod, claim and group,
  and DeviceTaintRules / DeviceClasses labelled with the run's id.

`close()` removes all of it, on success, failure and Ctrl-C (the caller's `finally`), and waits until
it is gone; what cannot be removed is reported with the command that removes it by label.
"""

from __future__ import annotations

from pathlib import Path

from fake_devices import config as driver_config
from fake_devices import keyfiles
from fake_devices.config import PROFILE_LABEL
from fake_devices.controller import INSTANCE_LABEL, FakeDriver, PublishError
from harness.core.errors import HarnessError
from harness.core.progress import Reporter
from harness.k8s import api, errors, wait
from load.scenarios import LOAD_LABEL, Placement

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # KWOK's own selector: a cluster running KWOK keeps these Ready
NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "250"}  # the load-gpu profile's NUMA node
PUBLISH_TIMEOUT = 300.0
CLEANUP_TIMEOUT = 180.0


def node_manifest(name: str, placement: Placement, with_devices: bool) -> dict:
    """One of the run's nodes; `with_devices`: labelled with the run's profile, so its driver publishes."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", LOAD_LABEL: placement.run_label}
    if with_devices:
        labels[PROFILE_LABEL] = placement.profile
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
            "spec": {"taints": [{"key": placement.node_taint, "value": placement.run_label, "effect": "NoSchedule"}]},
            "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY}}


def removal_hint(placement: Placement) -> str:
    selector = f"{LOAD_LABEL}={placement.run_label}"
    return (f"remove them with: kubectl delete namespace {placement.namespace}; kubectl delete "
            f"nodes,devicetaintrules,deviceclasses -l {selector}; kubectl delete resourceslices,deviceclasses "
            f"-l {INSTANCE_LABEL}={placement.driver_instance}")


class GuestRun:
    """The objects of one load run on a given cluster: `start()` creates them, `close()` removes them."""

    def __init__(self, kubeconfig: Path, placement: Placement, *, nodes: int, with_devices: bool,
                 profile_file: Path, reporter: Reporter):
        if not placement.node_taint:
            raise ValueError("a run on a given cluster needs its own node taint (Placement.guest)")
        self.placement, self.nodes, self.with_devices = placement, nodes, with_devices
        self.profile_file, self.reporter = profile_file, reporter
        self.api = api.ApiClient(keyfiles.load_configuration(kubeconfig))
        self.api.configuration.connection_pool_maxsize = 24
        self.core = api.CoreV1Api(self.api)
        self.resource = api.ResourceV1Api(self.api)
        self.driver: FakeDriver | None = None

    def start(self) -> None:
        names = self.placement.node_names(self.nodes)
        with self.reporter.counter(f"creating the run's own nodes ({names[0]}...)", len(names)) as counter:
            for name in names:
                try:
                    self.core.create_node(node_manifest(name, self.placement, self.with_devices))
                except errors.ApiError as err:
                    raise HarnessError(f"creating node {name} was refused: {err.status} {err.reason}",
                                       hint="a load run on a given cluster creates its own Node, DeviceClass, "
                                            "ResourceSlice and DeviceTaintRule objects and a namespace: it needs "
                                            "rights to create and delete them (cluster-admin)") from None
                counter.advance()
        config = driver_config.build(self.placement.driver_instance, self.placement.driver_domain,
                                     [str(self.profile_file)], source="(load run)", namespace=self.placement.namespace)
        with self.reporter.step(f"publishing the devices of the run's driver {self.placement.driver_instance} "
                                f"({'every node' if self.with_devices else 'none yet: they come as events'})"):
            self.driver = FakeDriver(config, self.api).start()
            try:
                self.driver.publish(timeout=PUBLISH_TIMEOUT)
            except PublishError as err:
                raise HarnessError(f"the run's fake driver could not publish its devices:\n{err}") from None

    def close(self, timeout: float = CLEANUP_TIMEOUT) -> None:
        """Remove everything the run made (also what the locust file made and did not remove) and wait
        until it is gone; a HarnessError names what is left and how to remove it."""
        try:
            with self.reporter.step(f"removing the run's own objects ({self.placement.run_label})"):
                self._delete()
                left = self._wait_gone(timeout)
        finally:
            self.api.close()
        if left:
            raise HarnessError(f"the load run's objects are still in the cluster after {timeout:.0f}s: "
                               + "; ".join(left), hint=removal_hint(self.placement))

    def _delete(self) -> None:
        selector = f"{LOAD_LABEL}={self.placement.run_label}"
        namespace = self.placement.namespace
        for rule in self.resource.list_device_taint_rule(label_selector=selector).items:
            errors.ignore_missing(self.resource.delete_device_taint_rule, rule.metadata.name)
        for cls in self.resource.list_device_class(label_selector=selector).items:
            errors.ignore_missing(self.resource.delete_device_class, cls.metadata.name)
        # The pods first, at once: on nodes without a kubelet nobody would confirm a graceful deletion.
        errors.ignore_missing(self.core.delete_collection_namespaced_pod, namespace, grace_period_seconds=0)
        errors.ignore_missing(self.core.delete_namespace, namespace)
        for node in self.core.list_node(label_selector=selector).items:
            errors.ignore_missing(self.core.delete_node, node.metadata.name)
        if self.driver is not None:
            self.driver.stop(delete_slices=True)  # its slices and its DeviceClass
        else:  # start() failed before the driver ran: its class may exist all the same
            for cls in self.resource.list_device_class(
                    label_selector=f"{INSTANCE_LABEL}={self.placement.driver_instance}").items:
                errors.ignore_missing(self.resource.delete_device_class, cls.metadata.name)

    def leftovers(self) -> list[str]:
        """What of the run is still in the cluster, one description per kind of object."""
        selector = f"{LOAD_LABEL}={self.placement.run_label}"
        instance = f"{INSTANCE_LABEL}={self.placement.driver_instance}"
        found = {
            "namespace": [n.metadata.name for n in self.core.list_namespace(
                field_selector=f"metadata.name={self.placement.namespace}").items],
            "nodes": [n.metadata.name for n in self.core.list_node(label_selector=selector).items],
            "DeviceTaintRules": [r.metadata.name for r in
                                 self.resource.list_device_taint_rule(label_selector=selector).items],
            "DeviceClasses": [c.metadata.name for c in self.resource.list_device_class(label_selector=selector).items]
            + [c.metadata.name for c in self.resource.list_device_class(label_selector=instance).items],
            "ResourceSlices": [s.metadata.name for s in self.resource.list_resource_slice(label_selector=instance).items],
        }
        return [f"{kind}: {', '.join(sorted(names)[:5])}" + (f" (+{len(names) - 5})" if len(names) > 5 else "")
                for kind, names in found.items() if names]

    def _wait_gone(self, timeout: float) -> list[str]:
        try:
            wait.until("the load run's objects to be gone", lambda: not self.leftovers(), timeout, interval=0.5)
        except wait.WaitTimeout:
            return self.leftovers()
        return []
