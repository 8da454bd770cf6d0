"""The API errors the harness, the suite and the load tests catch, by meaning (kubernetes 37.x raises one
class per status; fake_devices/kube.py names them, and this is the harness's door to them):
`except NotFound`, not `if err.status == 404`."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from fake_devices.kube import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ServerError,
    busy,
    expired,
    ignore_missing,
    message,
    refused,
    status_reason,
)

__all__ = ["ApiError", "BadRequest", "Conflict", "Forbidden", "Invalid", "NotFound", "ServerError", "busy", "expired", "from_status",
           "ignore_missing", "message", "refused", "status_reason"]

_BY_STATUS: dict[int, type[ApiException]] = {400: BadRequest, 403: Forbidden, 404: NotFound, 409: Conflict, 422: Invalid}


def from_status(status: int, reason: str) -> ApiException:
    """The typed error for an answer the client did not make itself (a raw GET of /metrics, /readyz)."""
    kind = _BY_STATUS.get(status) or (ServerError if 500 <= status <= 599 else ApiError)
    return kind(status=status, reason=reason)
