"""What several backends share: cluster names, the kubeconfig's endpoint, kubectl, API readiness,
the gates a kube-apiserver knows, and keeping or removing what a failed `up` made."""

from __future__ import annotations

import functools
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness import binaries
from harness.backends.commands import Runner
from harness.config import featuregates
from harness.core.errors import BinariesError, ConfigError, Problem
from harness.core.progress import Reporter
from harness.k8s.client import Clients, read_kubeconfig

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


def validate_name(name: str) -> str:
    """A cluster name every backend accepts (it names directories, kind clusters and label values)."""
    if not NAME_PATTERN.match(name or ""):
        raise ConfigError([Problem("--name", name or "''", "not a valid cluster name",
                                   "1-40 lowercase letters, digits and '-', starting and ending alphanumeric")])
    return name


def kubeconfig_endpoint(kubeconfig: Path | str, where: str = "--kubeconfig") -> tuple[str, str]:
    """(cluster name, server URL) of a kubeconfig's current context; ConfigError naming `where` if unusable."""
    current = read_kubeconfig(Path(kubeconfig).expanduser(), where)
    return current["name"], current["server"]


def find_kubectl(which=shutil.which) -> str | None:
    """The harness's own verified kubectl (binary cache) if installed, else kubectl on PATH."""
    try:
        cached = binaries.locate().path("kubectl")
        if cached.is_file():
            return str(cached)
    except BinariesError:
        pass
    return which("kubectl")


def api_ready(kubeconfig: Path) -> bool:
    """Whether the API server of `kubeconfig` answers /readyz with ok (any failure means not ready)."""
    if not kubeconfig.is_file():
        return False
    clients = Clients(kubeconfig)
    try:
        return clients.get_raw("/readyz").strip() == "ok"
    except Exception:  # unreachable, refused, bad credentials, ...: all mean "not ready" for a status
        return False
    finally:
        clients.close()


@contextmanager
def kept_or_removed_on_failure(reporter: Reporter, keep: bool, *, keep_it: Callable[[], None], keep_note: str,
                               remove_it: Callable[[], object]) -> Iterator[None]:
    """Around the part of `up` that makes things: on any failure (Ctrl-C too) either record the
    failed cluster for inspection (`--keep-on-failure`) or remove what was made, then re-raise."""
    try:
        yield
    except BaseException:
        if keep:
            keep_it()
            reporter.info(keep_note)
        else:
            with reporter.step("cleaning up after the failed start"):
                remove_it()
        raise


def known_gates(binset: binaries.BinarySet) -> set[str]:
    """The gate names the installed kube-apiserver accepts, from its own --help (the local backend runs
    it; kind checks its gates against the same minor)."""
    return set(_gates_of(str(binset.path("kube-apiserver"))))


@functools.lru_cache(maxsize=4)
def _gates_of(apiserver: str) -> frozenset[str]:
    """Once per binary and process: `run` checks a request and `up` checks it again (Backend.check)."""
    # not runnable (127) or no answer (124): empty output, so no names; the gates are checked again later
    return frozenset(featuregates.parse_known_gates(Runner().query([apiserver, "--help"]).stdout))
