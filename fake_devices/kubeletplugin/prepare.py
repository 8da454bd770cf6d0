"""NodePrepareResources / NodeUnprepareResources, independent of the gRPC API version.

Per claim, never for the whole call: every claim gets its own result, and a failure is the
claim's `error` string (the kubelet retries just those). Prepare: read the claim from the API,
check it is allocated for this node and driver (fake_devices.kubeletplugin.claims), look every
allocated device up in the driver's published slices, write the claim's CDI spec atomically,
record it in the checkpoint, answer with the devices and their CDI IDs. Nothing is written for a
claim that fails. Both operations are idempotent: a prepared claim is answered from the checkpoint
(its CDI file restored if it went missing); unpreparing an unknown claim succeeds.
"""

from __future__ import annotations

import json
import logging
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from fake_devices import kube
from fake_devices.kubeletplugin import cdi, claims, files
from fake_devices.kubeletplugin.cdi import AllocatedDevice, ClaimRef
from fake_devices.kubeletplugin.checkpoint import Checkpoint
from fake_devices.kubeletplugin.inventory import Inventory

log = logging.getLogger("fake_devices.kubeletplugin")
LOCK_STRIPES = 64


@dataclass(frozen=True)
class PreparedDevice:
    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]
    share_id: str | None = None

    def to_json(self) -> dict:
        return {"requestNames": self.request_names, "poolName": self.pool_name, "deviceName": self.device_name,
                "cdiDeviceIds": self.cdi_device_ids, "shareId": self.share_id}

    @classmethod
    def from_json(cls, data: dict) -> "PreparedDevice":
        return cls(list(data["requestNames"]), data["poolName"], data["deviceName"], list(data["cdiDeviceIds"]),
                   data.get("shareId"))


@dataclass
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


def base_request(request: str) -> str:
    """`gpu/small` -> `gpu`: the kubelet matches containers by the claim's request names, and
    expects subrequests (firstAvailable) stripped."""
    return request.split("/", 1)[0]


class Preparer:
    def __init__(self, driver: str, node: str, cdi_dir: Path, read_claim: Callable[[str, str], dict],
                 inventory: Inventory, checkpoint: Checkpoint, node_labels: Callable[[], dict[str, str]],
                 defects: frozenset[str] = frozenset()):
        self.driver, self.node = driver, node
        self.cdi_dir = Path(cdi_dir)
        self._read_claim = read_claim  # (namespace, name) -> the claim as a dict; raises kube.ApiError
        self.inventory = inventory
        self.checkpoint = checkpoint
        self._node_labels = node_labels
        self.defects = defects  # deliberate defects (config.DEFECTS), self-tests only
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]  # one claim is never worked on twice at once

    def _lock(self, uid: str) -> threading.Lock:
        return self._locks[zlib.crc32(uid.encode()) % LOCK_STRIPES]

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / cdi.spec_file_name(self.driver, uid)

    # --- prepare ----------------------------------------------------------------------------

    def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        for ref in refs:
            if ref.uid in results:
                continue  # the same claim twice in one call: one answer
            try:
                claims.check_ref(ref)
                with self._lock(ref.uid):
                    results[ref.uid] = PrepareResult(devices=self._prepare_one(ref))
            except claims.ClaimError as err:
                results[ref.uid] = PrepareResult(error=str(err))
            except Exception as err:  # anything unexpected still fails only this claim
                log.exception("prepare %s/%s (%s) failed", ref.namespace, ref.name, ref.uid)
                results[ref.uid] = PrepareResult(error=f"preparing {claims.describe(ref)} failed: "
                                                       f"{type(err).__name__}: {err}")
        if "drop-claim" in self.defects and len(results) > 1:
            results.pop(list(results)[-1])  # prepared, but not answered
        return results

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        entry = self.checkpoint.get(ref.uid)
        if entry is not None:  # already prepared (e.g. kubelet retry, or kubelet restart)
            path = Path(entry["specFile"])
            if not path.exists() and "stale-cdi" not in self.defects:
                files.atomic_write(path, cdi.encode(entry["spec"]))
                log.info("restored missing CDI spec %s of prepared claim %s", path, ref.uid)
            return [PreparedDevice.from_json(d) for d in entry["devices"]]
        claim = self._get_claim(ref)
        results, configs = claims.driver_results(claim, ref, self.driver, self.node, self._node_labels,
                                                 check_node="any-node" not in self.defects)
        allocated = [self._allocated_device(ref, result, configs) for result in results]
        spec, ids = cdi.build_spec(self.driver, ref, allocated)
        pool_suffix = "-x" if "wrong-pool" in self.defects else ""
        # empty request names: the device is "associated with all requests" (api.proto), so every container of
        # the claim gets it (the all-requests defect)
        devices = [PreparedDevice([] if "all-requests" in self.defects else [base_request(d.request)],
                                  d.pool + pool_suffix, d.device, [cdi_id], d.share_id)
                   for d, cdi_id in zip(allocated, ids)]
        path = self.spec_path(ref.uid)
        try:
            files.atomic_write(path, cdi.encode(spec))
        except OSError as err:
            raise claims.ClaimError(f"cannot write CDI spec {path} for {claims.describe(ref)}: {err}") from None
        entry = {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid, "specFile": str(path), "spec": spec,
                 "devices": [d.to_json() for d in devices],
                 "preparedAt": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        try:
            self.checkpoint.put(ref.uid, entry)
        except OSError as err:
            files.remove(path)  # not recorded, so not prepared: leave nothing behind
            raise claims.ClaimError(f"cannot record {claims.describe(ref)} in checkpoint "
                                    f"{self.checkpoint.path}: {err}") from None
        log.info("prepared claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid,
                 ", ".join(f"{d.pool_name}/{d.device_name}" for d in devices))
        return devices

    def _get_claim(self, ref: ClaimRef) -> dict:
        try:
            return self._read_claim(ref.namespace, ref.name)
        except kube.NotFound:
            raise claims.ClaimError(f"{claims.describe(ref)} not found: it was deleted (or never existed)") from None
        except kube.ApiError as err:
            raise claims.ClaimError(f"cannot read {claims.describe(ref)}: {err.status} {err.reason}") from None
        except (OSError, ValueError) as err:  # connection problems, a garbled answer
            raise claims.ClaimError(f"cannot read {claims.describe(ref)}: {err}") from None

    def _allocated_device(self, ref: ClaimRef, result: dict, configs: list[dict]) -> AllocatedDevice:
        pool, name = result.get("pool", ""), result.get("device", "")
        published = self.inventory.lookup(pool, name)
        if published is None and "any-node" in self.defects:
            published = {}  # answered as allocated, published here or not
        if published is None:
            pools = sorted(self.inventory.pools())
            where = f"its pools here are {', '.join(pools)}" if pools else "it publishes no devices here"
            raise claims.ClaimError(f"{claims.describe(ref)}: device {pool}/{name} is not published by driver "
                                    f"{self.driver} on node {self.node} ({where})")
        return AllocatedDevice(request=result.get("request", ""), driver=self.driver, pool=pool, device=name,
                               attributes=published.get("attributes") or {}, capacity=published.get("capacity") or {},
                               share_id=result.get("shareID"), consumed_capacity=result.get("consumedCapacity") or {},
                               admin_access=bool(result.get("adminAccess")),
                               configs=tuple(applying_configs(configs, result.get("request", ""))))

    # --- unprepare --------------------------------------------------------------------------

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        errors: dict[str, str] = {}
        for ref in refs:
            if ref.uid in errors:
                continue
            try:
                claims.check_ref(ref)
                with self._lock(ref.uid):
                    self._unprepare_one(ref)
                errors[ref.uid] = ""
            except claims.ClaimError as err:
                errors[ref.uid] = str(err)
            except Exception as err:
                log.exception("unprepare %s/%s (%s) failed", ref.namespace, ref.name, ref.uid)
                errors[ref.uid] = f"unpreparing {claims.describe(ref)} failed: {type(err).__name__}: {err}"
        return errors

    def _unprepare_one(self, ref: ClaimRef) -> None:
        entry = self.checkpoint.get(ref.uid)
        if entry is None and "unprepare-unknown-fails" in self.defects:
            raise claims.ClaimError("claim not prepared")
        # The file name follows from driver and UID, so even a claim the checkpoint does not know
        # (prepared, then the checkpoint was lost) leaves no CDI spec behind.
        paths = {self.spec_path(ref.uid)} | ({Path(entry["specFile"])} if entry else set())
        for path in paths if "keep-cdi" not in self.defects else ():
            try:
                files.remove(path)
            except OSError as err:
                raise claims.ClaimError(f"cannot remove CDI spec {path} of {claims.describe(ref)}: {err}") from None
        if entry is not None:
            try:
                self.checkpoint.delete(ref.uid)
            except OSError as err:
                raise claims.ClaimError(f"cannot update checkpoint {self.checkpoint.path}: {err}") from None
        log.info("unprepared claim %s/%s (%s)%s", ref.namespace, ref.name, ref.uid,
                 "" if entry is not None else ": was not prepared here")

    # --- start-up ---------------------------------------------------------------------------

    def restore(self) -> int:
        """After a restart: rewrite the CDI spec of every checkpointed claim whose file is missing."""
        restored = 0
        if "stale-cdi" in self.defects:  # the whole bug class: neither a start nor a repeat rewrites the spec
            return restored
        for uid, entry in self.checkpoint.claims().items():
            path = Path(entry["specFile"])
            if not path.exists():
                files.atomic_write(path, cdi.encode(entry["spec"]))
                restored += 1
        return restored


def applying_configs(configs: list[dict], request: str) -> list[tuple[str, object]]:
    """(source, opaque parameters) of this driver's configs that apply to a result of `request`:
    configs without requests apply to all, others to the requests they name (a subrequest matches its
    request too). The class's come first, then the claim's, each in their order: the order in which a
    driver applies them, so that the claim's settings override the class's."""
    applying = [(c.get("source", ""), c["opaque"].get("parameters")) for c in configs
                if not c.get("requests") or request in c["requests"] or base_request(request) in c["requests"]]
    return sorted(applying, key=lambda config: config[0] != "FromClass")  # stable: keeps order within a source


def read_claim_with(resource_api) -> Callable[[str, str], dict]:
    """A `read_claim` for Preparer from a kubernetes ResourceV1Api: raw JSON, no model conversion."""
    def read(namespace: str, name: str) -> dict:
        response = resource_api.read_namespaced_resource_claim(name, namespace, _preload_content=False,
                                                               _request_timeout=30)
        return json.loads(response.data)

    return read
