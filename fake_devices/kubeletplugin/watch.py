"""A small list+watch cache of raw API objects (dicts), like a client-go informer for one selector.

Raw JSON instead of the client's models: faster, and fields newer than the Python client (1.37
additions) are kept. Lists again after a 410 Gone or a broken stream; `stop()` shuts the stream's
socket so the thread ends at once.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable

from fake_devices import kube

log = logging.getLogger("fake_devices.kubeletplugin")
WATCH_SECONDS = 300  # the server ends each watch after this; it is resumed from the last version


class ListWatch:
    def __init__(self, what: str, list_call: Callable, on_change: Callable[[dict[str, dict]], None] | None = None,
                 **selectors):
        self.what = what
        self._list_call = list_call
        self._selectors = selectors
        self._on_change = on_change
        self._items: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._response = None
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> "ListWatch":
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.what}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            _shutdown(response)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def items(self) -> dict[str, dict]:
        with self._lock:
            return dict(self._items)

    # --- work -------------------------------------------------------------------------------

    def relist(self) -> str:
        """List now (also callable from other threads, e.g. on a cache miss); returns the list's
        resourceVersion."""
        response = self._list_call(_preload_content=False, _request_timeout=30, **self._selectors)
        body = json.loads(response.data)
        items = {_key(item): item for item in body.get("items") or []}
        with self._lock:
            self._items = items
        self.last_error = None
        self._synced.set()
        self._changed()
        return body["metadata"]["resourceVersion"]

    def _run(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self.relist()
                version = self._watch(version)
            except Exception as err:  # API unreachable, RBAC, broken stream: retry after a pause
                if self._stop.is_set():
                    break
                self.last_error = f"{type(err).__name__}: {getattr(err, 'reason', None) or err}"
                log.warning("%s: %s; listing again in 1s", self.what, self.last_error)
                version = None
                self._stop.wait(1)

    def _watch(self, version: str) -> str | None:
        """Follow one watch stream; return the version to resume from (None: list again)."""
        # The server ends the watch after WATCH_SECONDS (and sends bookmarks meanwhile); a read that
        # waits much longer means a dead connection.
        response = self._list_call(watch=True, resource_version=version, allow_watch_bookmarks=True,
                                   timeout_seconds=WATCH_SECONDS, _preload_content=False,
                                   _request_timeout=(30, WATCH_SECONDS + 60), **self._selectors)
        self._response = response
        try:
            if self._stop.is_set():
                return version
            for line in kube.iter_resp_lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:  # too old: list again
                        return None
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    if kind == "DELETED":
                        self._items.pop(_key(obj), None)
                    else:
                        self._items[_key(obj)] = obj
                self._changed()
                if self._stop.is_set():
                    break
            return version
        finally:
            self._response = None
            response.close()
            response.release_conn()

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self.items())
            except Exception:  # a listener's bug must not end the watch
                log.exception("%s: change handler failed", self.what)


def _key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _shutdown(response) -> None:
    """Unblock a thread reading the stream (closing alone can wait for the blocked read)."""
    try:
        connection = getattr(response, "connection", None)
        sock = getattr(connection, "sock", None) if connection is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
