"""The ResourceSlices of one driver on one node, published by the plugin itself from a node profile.

A vendor driver's kubelet plugin publishes its own node's devices; with `--publish-profile` the fake
driver's plugin does the same instead of relying on the control-plane half (fake_devices/controller.py).
The profile is static, so publishing happens once, at start: every slice is written with a pool
generation above any the driver has on this node (the scheduler then trusts only the new ones), and
slices of the driver on this node that the profile no longer yields are deleted afterwards.
"""

from __future__ import annotations

import json
import logging

from fake_devices import kube, render
from fake_devices import profile as profiles
from fake_devices.controller import SliceRejected

log = logging.getLogger("fake_devices.kubeletplugin")
# The fake-driver instance label of self-published slices: no controller instance has this name, so
# none takes them for its own (and deletes them as not desired).
PUBLISHER_INSTANCE = "kubelet-plugin"


class PublishError(Exception):
    """The slices could not be published; the text names the slice (or node) and the reason."""


class SlicePublisher:
    def __init__(self, resource_api, core_api, driver: str, node: str, profile: str,
                 instance: str = PUBLISHER_INSTANCE):
        self.resource, self.core = resource_api, core_api
        self.driver, self.node = driver, node
        self.profile_name = profile
        self.profile = profiles.load(profile)  # InvalidInput for an unknown name or a broken file
        self.instance = instance

    def desired(self, generation: int, node_uid: str | None) -> list[dict]:
        """This driver's slices on this node; a profile without devices for the driver is an error,
        since a plugin that publishes nothing cannot prepare anything."""
        domain = self.driver.split(".", 1)[1] if "." in self.driver else ""
        rendered = render.render_node(self.profile, self.node, render.Drivers(domain), generation=generation,
                                      node_uid=node_uid, instance=self.instance)
        if self.driver not in rendered:
            has = ", ".join(sorted(rendered)) or "none"
            raise PublishError(f"profile {self.profile_name} yields no ResourceSlices for driver {self.driver} "
                               f"(its drivers for domain {domain or '(none)'}: {has})")
        return rendered[self.driver]

    def existing(self) -> dict[str, dict]:
        """name -> slice of this driver on this node, as the API server has it (raw JSON)."""
        try:
            response = self.resource.list_resource_slice(
                field_selector=f"spec.driver={self.driver},spec.nodeName={self.node}",
                _preload_content=False, _request_timeout=30)
            items = json.loads(response.data).get("items") or []
        except Exception as err:  # a refusal, no answer (urllib3's errors are no OSError), or a garbled one
            raise PublishError(f"cannot list the ResourceSlices of driver {self.driver} on node {self.node}: "
                               f"{_text(err)}") from None
        return {item["metadata"]["name"]: item for item in items}

    def node_uid(self) -> str:
        """The Node's UID, for the slices' owner reference (the API server then collects the slices
        when the node goes away)."""
        try:
            return self.core.read_node(self.node, _request_timeout=30).metadata.uid
        except kube.NotFound:
            raise PublishError(f"node {self.node} not found: cannot publish its ResourceSlices") from None
        except kube.ApiError as err:
            raise PublishError(f"cannot read node {self.node}: {_text(err)}") from None
        except Exception as err:
            raise PublishError(f"cannot read node {self.node}: {_text(err)}") from None

    def publish(self) -> int:
        """Write the desired slices, then delete the driver's other slices on this node; returns the
        generation written."""
        existing = self.existing()
        generation = 1 + max((int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)
                              for s in existing.values()), default=0)
        desired = self.desired(generation, self.node_uid())
        for body in desired:
            name = body["metadata"]["name"]
            old = existing.get(name)
            try:
                if old is None:
                    self.resource.create_resource_slice(body, _preload_content=False, _request_timeout=30)
                else:
                    body = {**body, "metadata": {**body["metadata"],
                                                 "resourceVersion": old["metadata"]["resourceVersion"]}}
                    self.resource.replace_resource_slice(name, body, _preload_content=False, _request_timeout=30)
            except kube.ApiError as err:
                raise PublishError(str(SliceRejected(self.node, body, err))) from None
            except Exception as err:
                raise PublishError(f"cannot write ResourceSlice {name} (node {self.node}, driver {self.driver}): "
                                   f"{_text(err)}") from None
        stale = sorted(set(existing) - {body["metadata"]["name"] for body in desired})
        for name in stale:
            try:
                kube.ignore_missing(self.resource.delete_resource_slice, name, _request_timeout=30)
            except Exception as err:
                raise PublishError(f"cannot delete stale ResourceSlice {name} (node {self.node}, driver "
                                   f"{self.driver}): {_text(err)}") from None
        log.info("published %d ResourceSlices of %s on %s from profile %s (generation %d%s)", len(desired),
                 self.driver, self.node, self.profile_name, generation,
                 f", {len(stale)} stale deleted" if stale else "")
        return generation


def _text(err: Exception) -> str:
    """An API error as its status (the body is often a whole HTML page or Status), others with their type."""
    if isinstance(err, kube.ApiError):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"
