"""The one watch loop (harness/k8s/watching.py): resuming from the last version seen (bookmarks too), a 410
answered by a new list or by an error, the follower's choice to survive an error, raw and model events.
Pure logic: a stand-in for the client's Watch delivers scripted streams."""

from __future__ import annotations

import threading
from types import SimpleNamespace as NS

import pytest

from harness.k8s import errors, watching


def _event(kind: str, name: str, version: str) -> dict:
    raw = {"metadata": {"name": name, "resourceVersion": version}}
    return {"type": kind, "raw_object": raw, "object": NS(metadata=NS(name=name, resource_version=version))}


class Script:
    """Streams to deliver, one per call of `stream`; an exception in the list is raised at that call. After
    the last one the follower is stopped."""

    def __init__(self, *rounds):
        self.rounds = list(rounds)
        self.calls: list[dict] = []
        self.follow: watching.Follow | None = None
        self.done = threading.Event()

    def watch_class(self):
        script = self

        class FakeWatch:
            def __init__(self, return_type=None):
                self.return_type = return_type

            def stream(self, func, *args, **kwargs):
                script.calls.append(dict(kwargs, return_type=self.return_type, args=args))
                if not script.rounds:
                    script.follow._stopping.set()
                    script.done.set()
                    return
                current = script.rounds.pop(0)
                if isinstance(current, Exception):
                    raise current
                yield from current

            def stop(self):
                pass

        return FakeWatch


def _run(monkeypatch, script: Script, version="1", **options) -> tuple[watching.Follow, list, list]:
    seen: list = []
    listing = NS(items=[NS(metadata=NS(name="listed"))], metadata=NS(resource_version="50"))
    lists: list = []

    def list_call(*args, **kwargs):
        lists.append(kwargs)
        return listing

    monkeypatch.setattr(watching.api, "Watch", script.watch_class())
    monkeypatch.setattr(watching, "RESUME_PAUSE", 0)
    follow = watching.Follow(list_call, "ns", on_event=lambda kind, obj: seen.append((kind, obj)), **options)
    script.follow = follow
    follow.start(version)
    assert script.done.wait(5), script.calls
    follow.stop()
    return follow, seen, lists


def test_each_stream_resumes_from_the_last_version_seen_bookmarks_included(monkeypatch):
    bookmark = {"type": "BOOKMARK", "raw_object": {"metadata": {"resourceVersion": "77"}}, "object": {}}
    script = Script([_event("ADDED", "a", "5"), _event("MODIFIED", "a", "6")], [bookmark], [])
    _, seen, _ = _run(monkeypatch, script, model="ResourceV1ResourceClaim")
    assert [c["resource_version"] for c in script.calls] == ["1", "6", "77", "77"]
    assert all(c["return_type"] == "ResourceV1ResourceClaim" and c["allow_watch_bookmarks"] for c in script.calls)
    assert [(kind, obj.metadata.name) for kind, obj in seen] == [("ADDED", "a"), ("MODIFIED", "a")]  # no bookmark


def test_a_410_lists_again_and_goes_on_from_the_list(monkeypatch):
    relisted: list = []
    script = Script(errors.ApiError(status=410, reason="Gone"), [_event("ADDED", "b", "51")])
    _, seen, lists = _run(monkeypatch, script, on_relist=relisted.append, list_timeout=(5, 20))
    assert [c["resource_version"] for c in script.calls] == ["1", "50", "51"]
    assert [[i.metadata.name for i in items] for items in relisted] == [["listed"]]
    assert lists == [{"_request_timeout": (5, 20)}] and [obj.metadata.name for _, obj in seen] == ["b"]


@pytest.mark.parametrize("failure", [errors.ApiError(status=410, reason="Gone"), errors.ApiError(status=500, reason="x"),
                                     ConnectionResetError("reset")])
def test_without_a_way_on_the_follower_ends_and_says_why(monkeypatch, failure):
    reasons: list = []
    script = Script(failure)

    def on_error(err):
        reasons.append(err)
        script.done.set()
        return False

    follow, _, _ = _run(monkeypatch, script, on_error=on_error)
    follow._thread.join(5)
    assert reasons == [failure] and not follow._thread.is_alive() and len(script.calls) == 1


def test_a_follower_may_survive_an_error_and_resume_where_it_was(monkeypatch):
    script = Script([_event("ADDED", "a", "7")], ConnectionResetError("reset"), [_event("ADDED", "b", "8")])
    _, seen, _ = _run(monkeypatch, script, on_error=lambda err: True)
    assert [c["resource_version"] for c in script.calls] == ["1", "7", "7", "8"]
    assert [obj.metadata.name for _, obj in seen] == ["a", "b"]


def test_raw_followers_get_dicts_and_a_first_list_when_given_no_version(monkeypatch):
    relisted: list = []
    monkeypatch.setattr(watching, "_serializer", lambda: NS(sanitize_for_serialization=lambda item: {"listed": True}))
    script = Script([_event("DELETED", "a", "60")])
    _, seen, _ = _run(monkeypatch, script, version=None, raw=True, on_relist=relisted.append, bookmarks=False)
    assert relisted == [[{"listed": True}]] and script.calls[0]["resource_version"] == "50"
    assert "allow_watch_bookmarks" not in script.calls[0]
    assert seen == [("DELETED", {"metadata": {"name": "a", "resourceVersion": "60"}})]


def test_a_failure_is_described_by_status_or_type():
    assert watching.describe(errors.ApiError(status=403, reason="Forbidden")) == "403 Forbidden"
    assert watching.describe(ConnectionResetError("reset")) == "ConnectionResetError: reset"
