"""What a vendor-mode run sets up from the vendor file before the suite and takes down after it: the
objects of spec.manifests and the vendor's kubelet plugin on each real node (spec.kubeletPlugin).

One owner for both ways of running the suite: `dra-harness conformance run` sets up before it starts
pytest (so a pytest killed after its grace period still leaves nothing), and plain `pytest
--dra-driver-config` sets up in the pytest plugin's configure step; both call `set_up`, which checks the
file against the cluster first (`cluster_check`) unless the caller has. The suite learns what was done
from explicit pytest arguments (`VendorSetup.suite_arguments`), never from the environment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.k8s import errors
from harness.k8s.client import Clients
from harness.vendor import cluster_check
from harness.vendor.file import Manifest, VendorDriver
from harness.vendor.plugins import VendorPlugin, node_paths, real_nodes

# The suite's options (harness.pytest_plugin) that hand it what a run did: the vendor file is checked
# against the cluster and what it names is set up; the record file of the plugins the run started.
SET_UP_OPTION = "--dra-vendor-set-up"
PLUGINS_OPTION = "--dra-vendor-plugins"
RECORD_FILE = "vendor-plugins.json"  # in the local cluster's directory
MANAGED_LABEL = "dra-harness.x-k8s.io/vendor-manifest"  # on objects the run created from spec.manifests


def set_up(vendor: VendorDriver, kubeconfig: str | Path, reporter=None, *, checked: bool = False) -> VendorSetup:
    """Check the vendor file against the cluster (unless `checked`: the caller did, before anything was
    created), then set up what it names; the result's `close()` takes it down again. On a failure
    nothing is left set up."""
    if not checked:
        cluster_check.check(vendor, kubeconfig)
    setup = VendorSetup(vendor, Path(kubeconfig))
    setup.start(reporter)
    return setup


@dataclass
class VendorSetup:
    """What a vendor-mode run sets up from the vendor file and must take down again: the objects of
    spec.manifests (created first, so a plugin's start finds its classes) and one plugin per real node."""

    vendor: VendorDriver
    kubeconfig: Path
    plugins: list[VendorPlugin] = field(default_factory=list)
    created: list[tuple[Manifest, str]] = field(default_factory=list)  # (manifest, uid of what we created)
    record: Path | None = None

    def start(self, reporter=None) -> list[str]:
        """Set everything up; returns the arguments that tell the suite so (`suite_arguments`). On any
        failure what was already set up is taken down again before the error is raised."""
        try:
            clients = Clients(self.kubeconfig)
            try:
                for manifest in self.vendor.manifests:
                    body = json.loads(json.dumps(manifest.body))
                    labels = body.setdefault("metadata", {}).setdefault("labels", {}) or {}
                    labels[MANAGED_LABEL] = "true"
                    body["metadata"]["labels"] = labels
                    made = clients.resource.create_device_class(body)
                    self.created.append((manifest, made.metadata.uid))
            finally:
                clients.close()
            plugin = self.vendor.kubelet_plugin
            if plugin is None:
                return self.suite_arguments()
            cluster, nodes = real_nodes(self.kubeconfig, self.vendor.source)
            for node in nodes:
                values = node_paths(cluster, node)
                for driver in self.vendor.drivers:
                    # "The directory must exist" (kubeletplugin.PluginDataDirectoryPath, k8s.io/dynamic-resource-
                    # allocation v0.37.2): the deployer makes it, as a DaemonSet's hostPath would
                    (node.dirs.plugins / driver).mkdir(parents=True, exist_ok=True)
                started = VendorPlugin(cluster.directory, node.name, plugin.argv(values), plugin.environment(values),
                                       node.dirs.plugins_registry, self.vendor.drivers, cluster.kubeconfig)
                self.plugins.append(started)
                if reporter is not None:
                    reporter.info(f"starting the vendor's kubelet plugin on real node {node.name} "
                                  f"(log: {started.log})")
                started.start(wait_for_slices=True)
            self.record = cluster.directory / RECORD_FILE
            self.record.write_text(json.dumps([p.to_dict() for p in self.plugins], indent=2))
            return self.suite_arguments()
        except BaseException:
            self.close()
            raise

    def suite_arguments(self) -> list[str]:
        """The pytest arguments of a suite that runs on what this set up."""
        return [SET_UP_OPTION] + ([f"{PLUGINS_OPTION}={self.record}"] if self.record is not None else [])

    @property
    def holds_anything(self) -> bool:
        """Whether `close` has something to take down (a plugin running, an object created)."""
        return bool(self.plugins or self.created)

    @property
    def logs(self) -> list[Path]:
        return [plugin.log for plugin in self.plugins]

    def __enter__(self) -> VendorSetup:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> list[str]:
        """Stop the plugins, then delete what the run created (only those objects: same name and uid).
        Returns what could not be cleaned up."""
        leftovers = []
        for plugin in self.plugins:
            leftovers += plugin.stop()
        stopped, self.plugins = list(self.plugins), []
        if self.record is not None:
            self.record.unlink(missing_ok=True)
        if self.created or stopped:
            clients = Clients(self.kubeconfig)
            try:
                # The slices the stopped plugins published on their nodes: the kubelet would wipe them only
                # 30 s after the plugin is gone; the run removes them itself.
                for plugin in stopped:
                    for driver in plugin.drivers:
                        try:
                            clients.resource.delete_collection_resource_slice(
                                field_selector=f"spec.driver={driver},spec.nodeName={plugin.node}")
                        except errors.ApiError as err:
                            leftovers.append(f"ResourceSlices of {driver} on {plugin.node}: {err.status} {err.reason}")
                for manifest, uid in self.created:
                    try:
                        clients.resource.delete_device_class(manifest.name,
                                                             body={"preconditions": {"uid": uid}})
                    except (errors.NotFound, errors.Conflict):
                        pass  # gone already, or no longer ours (the uid precondition)
                    except errors.ApiError as err:
                        leftovers.append(f"{manifest.kind} {manifest.name}: {err.status} {err.reason}")
            finally:
                clients.close()
            self.created.clear()
        return leftovers
