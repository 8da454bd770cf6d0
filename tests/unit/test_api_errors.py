"""API errors by meaning (fake_devices/kube.py, harness/k8s/errors.py): the client's classes named, the
helpers every module uses instead of status codes, and the rule that nothing else reaches for
ApiException."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_devices import kube
from harness.k8s import errors

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = {REPO / "fake_devices" / "kube.py", REPO / "harness" / "k8s" / "errors.py"}


def _error(status: int, body: dict | None = None) -> errors.ApiError:
    err = errors.from_status(status, "reason")
    err.body = json.dumps(body) if body is not None else None
    return err


@pytest.mark.parametrize("status, kind", [(400, errors.BadRequest), (403, errors.Forbidden), (404, errors.NotFound),
                                          (409, errors.Conflict), (422, errors.Invalid), (503, errors.ServerError)])
def test_from_status_gives_the_class_the_client_raises(status, kind):
    err = errors.from_status(status, "x")
    assert type(err) is kind and err.status == status and isinstance(err, errors.ApiError)


def test_ignore_missing_returns_the_result_or_none_and_lets_other_errors_through():
    assert kube.ignore_missing(lambda a, b=0: a + b, 1, b=2) == 3

    def missing():
        raise _error(404)

    assert kube.ignore_missing(missing) is None

    def conflict():
        raise _error(409)

    with pytest.raises(errors.Conflict):
        kube.ignore_missing(conflict)


def test_message_and_reason_come_from_the_status_body():
    err = _error(409, {"kind": "Status", "reason": "AlreadyExists", "message": 'deviceclasses "x" already exists'})
    assert errors.message(err) == 'deviceclasses "x" already exists' and errors.status_reason(err) == "AlreadyExists"
    plain = _error(500)
    plain.body = "<html>bad gateway</html>"
    assert errors.message(plain) == "<html>bad gateway</html>" and errors.status_reason(plain) == ""
    assert errors.message(_error(404)) == "reason"


def test_what_may_pass_on_a_retry_and_what_never_will():
    assert errors.busy(_error(503)) and errors.busy(errors.from_status(429, "throttled"))
    assert not errors.busy(_error(409)) and not errors.busy(ValueError())
    assert errors.expired(errors.ApiError(status=410, reason="Gone"))  # the client's Watch raises it untyped
    assert errors.refused(_error(422)) and errors.refused(_error(403))
    assert not any(errors.refused(_error(s)) for s in (404, 409, 503)) and not errors.refused(ValueError())


def test_nothing_outside_the_adapters_reaches_for_apiexception():
    found = []
    for package in ("harness", "fake_devices", "load", "conformance"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path not in ADAPTERS and "ApiException" in path.read_text():
                found.append(str(path.relative_to(REPO)))
    assert not found, f"catch harness.k8s.errors / fake_devices.kube types instead: {found}"
