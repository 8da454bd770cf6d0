"""The fake driver's door to the Kubernetes API: its processes (controller, kubelet plugin, health monitor,
attacher) get their client, the API groups they call, watches and their error types here; no other module
of fake_devices imports `kubernetes` (but keyfiles.py, which only hands the client its key files). It needs
only the `kubernetes` client, so the fake driver stays installable without the harness; the harness's own
door (harness/k8s) builds on it.

Errors are typed by the client itself (kubernetes 37.x raises a subclass of ApiException per status, see
kubernetes.client.exceptions.ApiException.from_response); they are named here for what they mean, so
code says `except NotFound` rather than comparing status codes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
from kubernetes.client import (
    AdmissionregistrationV1Api,
    ApiClient,
    AppsV1Api,
    Configuration,
    CoreV1Api,
    ResourceV1alpha3Api,
    ResourceV1Api,
    ResourceV1beta1Api,
    ResourceV1beta2Api,
    SchedulingV1beta1Api,
)
from kubernetes.client.exceptions import ApiException as ApiError
from kubernetes.client.exceptions import BadRequestException as BadRequest
from kubernetes.client.exceptions import ConflictException as Conflict
from kubernetes.client.exceptions import ForbiddenException as Forbidden
from kubernetes.client.exceptions import NotFoundException as NotFound
from kubernetes.client.exceptions import ServiceException as ServerError
from kubernetes.client.exceptions import UnprocessableEntityException as Invalid
from kubernetes.config import ConfigException
from kubernetes.watch import Watch
from kubernetes.watch.watch import iter_resp_lines

from fake_devices import keyfiles

__all__ = [
    # the API groups the project uses, a watch, and the client's configuration
    "AdmissionregistrationV1Api", "ApiClient", "AppsV1Api", "ConfigException", "Configuration", "CoreV1Api",
    "ResourceV1Api", "ResourceV1alpha3Api", "ResourceV1beta1Api", "ResourceV1beta2Api", "SchedulingV1beta1Api",
    "Watch", "api_client", "iter_resp_lines",
    # errors by meaning, and what to do about them
    "ApiError", "BadRequest", "Conflict", "Forbidden", "Invalid", "NotFound", "ServerError", "busy", "expired",
    "ignore_missing", "message", "refused", "status_reason",
]

# Client errors that another try may not meet: the object went or came meanwhile, a stale version, a watch
# too old, throttling. Any other 4xx is the server refusing the request as it is.
_TRANSIENT = frozenset({404, 409, 410, 429})

T = TypeVar("T")


def api_client(kubeconfig: str | None, pool_size: int | None = None) -> ApiClient:
    """From `--kubeconfig` when given, else the pod's in-cluster configuration (a DaemonSet or
    Deployment). Raises kubernetes.config.ConfigException when neither is usable."""
    if kubeconfig:
        client = ApiClient(keyfiles.load_configuration(kubeconfig))
    else:
        kubernetes.config.load_incluster_config()
        client = ApiClient()
    if pool_size:
        # urllib3 keeps this many connections per host; the default (4) serialises parallel writers
        client.configuration.connection_pool_maxsize = pool_size
    return client


def ignore_missing(call: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Call a delete (or any API call); NotFound means the work is already done (None)."""
    try:
        return call(*args, **kwargs)
    except NotFound:
        return None


def _status(err: ApiError) -> dict:
    """The API server's Status object in the error's body ({} when the body is not one)."""
    try:
        found = json.loads(err.body or "")
    except (TypeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def message(err: ApiError) -> str:
    """What the API server said (the Status message), else the body or the HTTP reason."""
    return str(_status(err).get("message") or err.body or err.reason or "").strip()


def status_reason(err: ApiError) -> str:
    """The Status reason (AlreadyExists, Conflict, Invalid, Forbidden, ...), '' when the body has none: a 409
    is AlreadyExists for a create, Conflict for an update of a stale object."""
    return str(_status(err).get("reason") or "")


def expired(err: ApiError) -> bool:
    """A watch's resourceVersion is too old (410 Gone, which the client's Watch raises untyped): list again."""
    return err.status == 410


def refused(err: BaseException) -> bool:
    """The API server refused the request as it is (a 4xx that no retry fixes: invalid, forbidden, ...)."""
    return isinstance(err, ApiError) and bool(err.status) and 400 <= err.status < 500 and err.status not in _TRANSIENT


def busy(err: BaseException) -> bool:
    """Throttled (429) or the server could not serve it now (5xx): the same request may pass a moment later."""
    return isinstance(err, ServerError) or (isinstance(err, ApiError) and err.status == 429)
