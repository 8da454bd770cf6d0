"""Which drivers' devices a test was allocated: the report credits a feature to the driver under test
only when a passing test of that feature allocated one of its devices.

A watch on the ResourceClaims of the test's namespace from before the test starts, so claims that
come and go within the test (a pod's generated claim, deleted with the pod) are seen too.
"""

from __future__ import annotations

import threading

from harness.k8s import api, errors
from harness.k8s.client import Clients

CLAIM_MODEL = "ResourceV1ResourceClaim"
LIST_TIMEOUT = (5, 20)  # (connect, read) seconds: a namespace's claims list in well under a second


def _drivers(claim) -> set[str]:
    allocation = claim.status.allocation if claim.status else None
    return {r.driver for r in (allocation.devices.results or [])} if allocation and allocation.devices else set()


class AllocatedDrivers:
    """Context manager: `.drivers` is every driver with a device allocated to a claim of `namespace`."""

    def __init__(self, k8s: Clients, namespace: str):
        self.k8s, self.namespace = k8s, namespace
        self.drivers: set[str] = set()
        self.complete = True  # False when the watch broke: the record may miss claims
        self._stop = threading.Event()
        self._watch: api.Watch | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "AllocatedDrivers":
        version = self.k8s.resource.list_namespaced_resource_claim(self.namespace).metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True,
                                        name=f"allocations-{self.namespace}")
        self._thread.start()
        return self

    def _run(self, version: str) -> None:
        while not self._stop.is_set():
            # The client names the claim model ResourceV1ResourceClaim; the watch would guess V1ResourceClaim
            # from the list call, fail on every first event, and leave only the claims still there at the end.
            self._watch = api.Watch(return_type=CLAIM_MODEL)
            try:
                for event in self._watch.stream(self.k8s.resource.list_namespaced_resource_claim, self.namespace,
                                                resource_version=version, timeout_seconds=10,
                                                allow_watch_bookmarks=True):
                    obj = event["object"]
                    if isinstance(obj, dict):  # a BOOKMARK: only metadata, which the client leaves a dict
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        continue
                    version = obj.metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.drivers |= _drivers(obj)
                    if self._stop.is_set():
                        return
            except errors.ApiError as error:
                if errors.expired(error) and not self._stop.is_set():
                    # The version got compacted away while the test was quiet (each watch ends after 10 s
                    # and resumes from the last event's version): relist and go on from there.
                    version = self._relist()
                    if version:
                        continue
                if not self._stop.is_set():
                    self.complete = False
                return
            except Exception:  # e.g. the namespace went away: say the record may be short
                if not self._stop.is_set():
                    self.complete = False
                return
            finally:
                self._watch.stop()

    def _relist(self) -> str:
        """Collect the claims there now; their list's version ("" when the list failed)."""
        try:
            listed = self.k8s.resource.list_namespaced_resource_claim(self.namespace, _request_timeout=LIST_TIMEOUT)
        except Exception:
            return ""
        for claim in listed.items:
            self.drivers |= _drivers(claim)
        return listed.metadata.resource_version

    def __exit__(self, *exc) -> None:
        try:  # what is still there now, in case the last event had not arrived yet
            # bounded: through an apiserver whose etcd died the list hangs for minutes (CI, etcd killed)
            listed = self.k8s.resource.list_namespaced_resource_claim(self.namespace, _request_timeout=LIST_TIMEOUT)
            for claim in listed.items:
                self.drivers |= _drivers(claim)
        except Exception:
            self.complete = False
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
