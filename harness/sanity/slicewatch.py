"""What a plugin's ResourceSlices did over time, as a watch saw it: for the publication rules that a single
look cannot judge (a change without a new generation, a pool left incomplete while it is republished).

`SliceWatch` records every event of the drivers' slices from before the plugin starts to the end of the
checks (its restarts republish); `same_generation_changes` and `incomplete_spells` judge the record and
are pure, so their unit tests feed them events.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from harness.k8s import api, errors


@dataclass(frozen=True)
class Event:
    at: float  # monotonic seconds
    kind: str  # ADDED | MODIFIED | DELETED
    slice: dict  # the ResourceSlice as JSON


def _pool(obj: dict) -> tuple[str, str]:
    return obj["spec"]["driver"], obj["spec"]["pool"]["name"]


def _content(obj: dict) -> dict:
    """What a slice says about its pool's resources (a change of it needs a new generation)."""
    spec = obj["spec"]
    return {k: spec.get(k) for k in ("devices", "sharedCounters", "nodeName", "nodeSelector", "allNodes",
                                      "perDeviceNodeSelection")}


def same_generation_changes(events: list[Event]) -> list[str]:
    """Slices whose resources changed while their pool generation stayed the same (KP-SLICES-GENERATION)."""
    last: dict[str, dict] = {}
    defects = []
    for event in events:
        name = event.slice["metadata"]["name"]
        before = last.get(name)
        if event.kind == "DELETED":
            last.pop(name, None)
            continue
        if before is not None and before["spec"]["pool"]["generation"] == event.slice["spec"]["pool"]["generation"] \
                and _content(before) != _content(event.slice):
            driver, pool = _pool(event.slice)
            changed = sorted(k for k in _content(event.slice) if _content(before)[k] != _content(event.slice)[k])
            defects.append(f"slice {name} of pool {driver}/{pool} changed its {', '.join(changed)} and kept "
                           f"generation {event.slice['spec']['pool']['generation']}")
        last[name] = event.slice
    return defects


def incomplete_spells(events: list[Event], until: float) -> dict[tuple[str, str], float]:
    """Per pool, the longest stretch of time it was incomplete: its newest generation's slices fewer than
    their resourceSliceCount, or disagreeing on it (a pool with no slice left is gone, not incomplete)."""
    current: dict[str, dict] = {}
    since: dict[tuple[str, str], float] = {}
    longest: dict[tuple[str, str], float] = {}

    def judge(pool: tuple[str, str], at: float) -> None:
        slices = [s for s in current.values() if _pool(s) == pool]
        bad = False
        if slices:
            newest = max(s["spec"]["pool"]["generation"] for s in slices)
            counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices if s["spec"]["pool"]["generation"] == newest}
            bad = len(counts) != 1 or sum(s["spec"]["pool"]["generation"] == newest for s in slices) < next(iter(counts))
        if bad:
            since.setdefault(pool, at)
        elif pool in since:
            longest[pool] = max(longest.get(pool, 0.0), at - since.pop(pool))

    for event in events:
        name = event.slice["metadata"]["name"]
        if event.kind == "DELETED":
            current.pop(name, None)
        else:
            current[name] = event.slice
        judge(_pool(event.slice), event.at)
    for pool, start in since.items():  # still incomplete at the end
        longest[pool] = max(longest.get(pool, 0.0), until - start)
    return longest


@dataclass
class SliceWatch:
    """A thread that records every event of `drivers`' ResourceSlices until `stop()`."""

    api_client: api.ApiClient
    drivers: tuple[str, ...]
    events: list[Event] = field(default_factory=list)
    error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> SliceWatch:
        self._thread = threading.Thread(target=self._run, name="slice-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        resource = api.ResourceV1Api(self.api_client)
        version = None
        while not self._stop.is_set():
            watch = api.Watch()
            try:
                if version is None:  # a list first; its items count as added now
                    listing = resource.list_resource_slice()
                    version = listing.metadata.resource_version
                    for item in listing.items:
                        self._record("ADDED", self.api_client.sanitize_for_serialization(item))
                for event in watch.stream(resource.list_resource_slice, resource_version=version, timeout_seconds=5):
                    obj = event["raw_object"]
                    version = obj["metadata"].get("resourceVersion") or version
                    self._record(event["type"], obj)
                    if self._stop.is_set():
                        break
            except errors.ApiError as err:
                if errors.expired(err):  # too old: list again (a gap the checks cannot judge: say so)
                    version = None
                    self.error = "the watch was restarted (410 Gone): events in between may be missing"
                    continue
                self.error = f"the slice watch failed: {err.status} {err.reason}"
                return
            except Exception as err:  # the watch must never take the checks down
                self.error = f"the slice watch failed: {type(err).__name__}: {err}"
                return
            finally:
                watch.stop()

    def _record(self, kind: str, obj: dict) -> None:
        if kind in ("ADDED", "MODIFIED", "DELETED") and (obj.get("spec") or {}).get("driver") in self.drivers:
            with self._lock:
                self.events.append(Event(time.monotonic(), kind, obj))

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
