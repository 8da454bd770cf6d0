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

from harness.k8s import api, watching


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
    """Records every event of `drivers`' ResourceSlices until `stop()`: a list first, whose slices count as
    added then, and the changes after it."""

    api_client: api.ApiClient
    drivers: tuple[str, ...]
    events: list[Event] = field(default_factory=list)
    error: str = ""
    _follow: watching.Follow | None = None
    _listed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> SliceWatch:
        resource = api.ResourceV1Api(self.api_client)
        follow = watching.Follow(resource.list_resource_slice, on_event=self._record, on_relist=self._relisted,
                                 on_error=self._failed, raw=True, timeout_seconds=5, bookmarks=False,
                                 name="slice-watch")
        try:
            self._follow = follow.start()
        except Exception as err:  # no first list: the checks over time say why they have nothing
            self._failed(err)
        return self

    def _relisted(self, items: list[dict]) -> None:
        if self._listed:  # the version was too old: a gap the checks cannot judge, so say so
            self.error = "the watch was restarted (410 Gone): events in between may be missing"
        self._listed = True
        for item in items:
            self._record("ADDED", item)

    def _failed(self, err: Exception) -> bool:
        # the watch must never take the checks down: it ends, and the checks read why
        self.error = f"the slice watch failed: {watching.describe(err)}"
        return False

    def _record(self, kind: str, obj: dict) -> None:
        if kind in ("ADDED", "MODIFIED", "DELETED") and (obj.get("spec") or {}).get("driver") in self.drivers:
            with self._lock:
                self.events.append(Event(time.monotonic(), kind, obj))

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def stop(self) -> None:
        if self._follow is not None:
            self._follow.stop()
