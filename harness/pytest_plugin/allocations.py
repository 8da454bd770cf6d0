"""Which drivers' devices a test was allocated: the report credits a feature to the driver under test
only when a passing test of that feature allocated one of its devices.

A watch on the ResourceClaims of the test's namespace from before the test starts, so claims that
come and go within the test (a pod's generated claim, deleted with the pod) are seen too.
"""

from __future__ import annotations

from harness.k8s import watching
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
        # A version compacted away while the test was quiet (each stream ends after 10 s and resumes from the
        # last version seen) is listed again. The client names the claim model ResourceV1ResourceClaim; the
        # watch would guess V1ResourceClaim from the list call, fail on every first event, and leave only the
        # claims still there at the end.
        self._follow = watching.Follow(k8s.resource.list_namespaced_resource_claim, namespace, on_event=self._event,
                                       on_relist=self._listed, on_error=self._broke, model=CLAIM_MODEL,
                                       timeout_seconds=10, list_timeout=LIST_TIMEOUT, name=f"allocations-{namespace}")

    def __enter__(self) -> "AllocatedDrivers":
        version = self.k8s.resource.list_namespaced_resource_claim(self.namespace).metadata.resource_version
        self._follow.start(version)
        return self

    def _event(self, kind: str, claim) -> None:
        self.drivers |= _drivers(claim)

    def _listed(self, claims: list) -> None:
        for claim in claims:
            self.drivers |= _drivers(claim)

    def _broke(self, err: Exception) -> bool:  # e.g. the namespace went away: say the record may be short
        self.complete = False
        return False

    def __exit__(self, *exc) -> None:
        try:  # what is still there now, in case the last event had not arrived yet
            # bounded: through an apiserver whose etcd died the list hangs for minutes (CI, etcd killed)
            listed = self.k8s.resource.list_namespaced_resource_claim(self.namespace, _request_timeout=LIST_TIMEOUT)
            self._listed(listed.items)
        except Exception:
            self.complete = False
        self._follow.stop(join_seconds=5)
