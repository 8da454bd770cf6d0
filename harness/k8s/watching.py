"""Following a collection of API objects as it changes: the one watch loop of the harness, the suite and the
load tests (the shipped fake driver has its own, fake_devices/controller.py, as it must install without the
harness).

A watch stream ends when the server closes it (`timeout_seconds`) and is then resumed from the last
resourceVersion seen, bookmarks included, so no change is missed and none is delivered twice. When that
version is too old (410 Expired: compacted while nothing changed), nothing can tell what happened in
between; a follower that can live with that lists the collection again (`on_relist`), any other ends, as on
any other error, and says so through `on_error`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from harness.k8s import api, errors

CHANGES = ("ADDED", "MODIFIED", "DELETED")
RESUME_PAUSE = 0.2  # before resuming after an error the follower chose to survive


def describe(err: Exception) -> str:
    """Why a follower's stream failed, in a few words: the API's status and reason, or the error's type."""
    if isinstance(err, errors.ApiError):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"


_SERIALIZER: list = []


def _serializer() -> Any:
    """A client for turning listed models into the JSON dicts a raw watch event carries (made once)."""
    if not _SERIALIZER:
        _SERIALIZER.append(api.ApiClient())
    return _SERIALIZER[0]


class Follow:
    """Follows the objects of `list_call(*args, **kwargs)` on a thread of its own.

    - `on_event(type, object)`: every ADDED/MODIFIED/DELETED, in order; `raw=True` gives the JSON dict,
      else the client's model (`model` names it where the client cannot derive it from the list call).
    - `on_relist(items)`: the objects there now, after a list: the first one when `start` is given no
      version, and the one after a 410. Without it a 410 is an error.
    - `on_error(err) -> bool`: the stream failed (not while stopping); True resumes from the last version
      seen after a short pause, False ends the follower. Without it the follower ends.
    """

    def __init__(self, list_call: Callable[..., Any], *args: Any, on_event: Callable[[str, Any], None],
                 on_relist: Callable[[list], None] | None = None, on_error: Callable[[Exception], bool] | None = None,
                 model: str | None = None, raw: bool = False, timeout_seconds: int = 20, bookmarks: bool = True,
                 list_timeout: Any = None, name: str = "watch", **kwargs: Any):
        self.list_call, self.args, self.kwargs = list_call, args, kwargs
        self.on_event, self.on_relist, self.on_error = on_event, on_relist, on_error
        self.model, self.raw, self.timeout_seconds, self.bookmarks = model, raw, timeout_seconds, bookmarks
        self.list_timeout, self.name = list_timeout, name
        self.version: str | None = None
        self._stopping = threading.Event()
        self._watch: Any = None
        self._thread: threading.Thread | None = None

    def start(self, version: str | None = None) -> Follow:
        """From `version` on; without one, list first (its items go to `on_relist`) and go on from that list.
        The first list runs here, so that its failure is the caller's."""
        self.version = version if version is not None else self._relist()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, join_seconds: float = 10) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=join_seconds)

    def _relist(self) -> str:
        extra = {"_request_timeout": self.list_timeout} if self.list_timeout else {}
        listing = self.list_call(*self.args, **self.kwargs, **extra)
        if self.on_relist is not None:
            items = listing.items
            self.on_relist([self._serialize(i) for i in items] if self.raw else list(items))
        return listing.metadata.resource_version

    def _serialize(self, item: Any) -> dict:
        return _serializer().sanitize_for_serialization(item)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._watch = api.Watch(return_type=self.model) if self.model else api.Watch()
            try:
                self._stream()
            except Exception as err:
                if self._stopping.is_set():  # stop() closed the stream under us
                    return
                if isinstance(err, errors.ApiError) and errors.expired(err) and self.on_relist is not None:
                    try:
                        self.version = self._relist()
                        continue
                    except Exception as relist_error:
                        err = relist_error
                if self.on_error is None or not self.on_error(err):
                    return
                self._stopping.wait(RESUME_PAUSE)
            finally:
                self._watch.stop()

    def _stream(self) -> None:
        options: dict[str, Any] = {"resource_version": self.version, "timeout_seconds": self.timeout_seconds}
        if self.bookmarks:
            options["allow_watch_bookmarks"] = True
        for event in self._watch.stream(self.list_call, *self.args, **self.kwargs, **options):
            raw = event.get("raw_object") or {}
            self.version = (raw.get("metadata") or {}).get("resourceVersion") or self.version
            if event["type"] in CHANGES:
                self.on_event(event["type"], raw if self.raw else event["object"])
            if self._stopping.is_set():
                return
