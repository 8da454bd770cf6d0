"""The fake driver's attach controller: what an external controller does for devices with binding
conditions (DRADeviceBindingConditions, KEP-5007).

A device published with `bindingConditions` holds a pod in the scheduler's PreBind until every one of
them is True in the claim's `status.devices` entry for that device, or until one of its
`bindingFailureConditions` is True (the scheduler then clears the allocation and schedules the pod
again), or until the scheduler's bindingTimeout passes (k8s.io/api@v0.37.2 resource/v1 Device;
k8s.io/kubernetes@v1.37.2 pkg/scheduler/framework/plugins/dynamicresources: isClaimReadyForBinding,
isClaimTimeout, PostFilter). Real drivers have a controller that attaches the device (a fabric, a
hot-plug) and then writes those conditions. This one acts a profile's `binding.attach` out,
`attachSeconds` after it sees the allocation:

- succeeds: every binding condition True;
- fails-once: the first allocation of a device to a claim gets a failure condition True, a later one
  of the same device to the same claim succeeds (a transient attach error);
- fails: a failure condition True every time;
- never: nothing is written (the scheduler's bindingTimeout decides).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone

from fake_devices import kube
from fake_devices.hardware import Binding, Profile

log = logging.getLogger("fake_devices")
CONFLICT_RETRIES = 10
# the Python client's model of resource.k8s.io/v1 ResourceClaim (beside core's CoreV1ResourceClaim); a watch
# cannot derive it from the list's name
CLAIM_MODEL = "ResourceV1ResourceClaim"
REASON = "FakeAttachController"


def binding_of(profile: Profile, device: str) -> Binding | None:
    """The binding settings of a device of `profile` by its published name (a GPU or one of its MIG devices)."""
    for group in profile.gpus:
        if group.binding is None:
            continue
        for i in range(group.count):
            name = f"{group.prefix}-{i}"
            if device == name or device.startswith(f"{name}-mig-"):
                return group.binding
    return None


def has_bindings(profiles: dict[str, Profile]) -> bool:
    return any(group.binding for profile in profiles.values() for group in profile.gpus)


class Attacher:
    """Watches claims (through the driver's claim source) and answers each allocated device of ours that has
    binding conditions once. `lookup(driver, pool, device)` gives the device's Binding or None."""

    def __init__(self, api_client: kube.ApiClient, lookup: Callable[[str, str, str], Binding | None],
                 stop: threading.Event):
        self.resource = kube.ResourceV1Api(api_client)
        self.api = api_client
        self.lookup = lookup
        self.stop = stop
        self._lock = threading.Lock()
        self._answered: set[tuple] = set()  # (claim uid, allocation timestamp, driver, pool, device)
        self._failed_once: set[tuple] = set()  # (claim uid, driver, pool, device)
        # the newest answers (claim, device, outcome), for tests and logs; bounded for a long-lived driver
        self.answers: deque[tuple[str, str, str]] = deque(maxlen=1000)

    def on_list(self, claims: list) -> None:
        for claim in claims:
            self.on_event("ADDED", claim)

    def on_event(self, kind: str, claim) -> None:
        if kind == "DELETED":  # forget the claim: what a long-lived driver remembers stays bounded
            with self._lock:
                self._answered = {key for key in self._answered if key[0] != claim.metadata.uid}
                self._failed_once = {key for key in self._failed_once if key[0] != claim.metadata.uid}
            return
        if claim.status is None or claim.status.allocation is None:
            return
        allocation = claim.status.allocation
        stamp = str(allocation.allocation_timestamp or "")
        for result in (allocation.devices.results or []) if allocation.devices else []:
            if not result.binding_conditions:
                continue
            binding = self.lookup(result.driver, result.pool, result.device)
            if binding is None or binding.attach == "never":
                continue
            key = (claim.metadata.uid, stamp, result.driver, result.pool, result.device)
            with self._lock:
                if key in self._answered:
                    continue
                self._answered.add(key)
            timer = threading.Timer(binding.attach_seconds, self._answer,
                                    args=(claim.metadata.namespace, claim.metadata.name, claim.metadata.uid, stamp,
                                          result, binding))
            timer.daemon = True
            timer.start()

    def _outcome(self, uid: str, result, binding: Binding) -> bool:
        """True: the attach succeeds; False: it fails."""
        if binding.attach == "succeeds":
            return True
        if binding.attach == "fails":
            return False
        once = (uid, result.driver, result.pool, result.device)
        with self._lock:
            if once in self._failed_once:
                return True
            self._failed_once.add(once)
            return False

    def _answer(self, namespace: str, name: str, uid: str, stamp: str, result, binding: Binding) -> None:
        if self.stop.is_set():
            return
        succeeded = self._outcome(uid, result, binding)
        now = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        if succeeded:
            conditions = [{"type": c, "status": "True", "reason": "Attached", "lastTransitionTime": now,
                           "message": "attached by the fake driver's attach controller"}
                          for c in result.binding_conditions]
        else:
            conditions = [{"type": result.binding_failure_conditions[0], "status": "True", "reason": "AttachFailed",
                           "lastTransitionTime": now,
                           "message": f"the fake driver's attach controller failed to attach ({binding.attach})"}]
        for _ in range(CONFLICT_RETRIES):
            claim = kube.ignore_missing(self.resource.read_namespaced_resource_claim_status, name, namespace)
            if claim is None:
                return
            allocation = claim.status.allocation if claim.status else None
            if claim.metadata.uid != uid or allocation is None or str(allocation.allocation_timestamp or "") != stamp:
                return  # deleted, replaced or allocated anew meanwhile: that allocation gets its own answer
            status = self.api.sanitize_for_serialization(claim.status)
            entries = [d for d in (status.get("devices") or [])
                       if (d.get("driver"), d.get("pool"), d.get("device")) != (result.driver, result.pool, result.device)]
            entries.append({"driver": result.driver, "pool": result.pool, "device": result.device,
                            "conditions": conditions})
            # Only status.devices, as of the version read (a conflict means: read again). Writing the whole
            # claim back would send the allocation as the client model re-serialized it, which the API server
            # may take for a change of the allocation (it refused one with configs: "field cannot be modified
            # once set").
            patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": {"devices": entries}}
            try:
                self.resource.patch_namespaced_resource_claim_status(name, namespace, patch)
            except kube.Conflict:  # the scheduler wrote in between: read again
                time.sleep(0.05)
                continue
            except kube.NotFound:
                return
            except kube.ApiError as err:
                log.warning("attach controller: status of claim %s/%s: %s %s", namespace, name, err.status, err.body)
                return
            outcome = "attached" if succeeded else "failed"
            with self._lock:
                self.answers.append((f"{namespace}/{name}", f"{result.driver}/{result.pool}/{result.device}", outcome))
            log.info("attach controller: %s %s/%s/%s for claim %s/%s", outcome, result.driver, result.pool,
                     result.device, namespace, name)
            return
        log.warning("attach controller: claim %s/%s kept changing; gave up writing its device status", namespace, name)
