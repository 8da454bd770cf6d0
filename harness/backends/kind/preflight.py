"""What the machine must have for the kind backend: the docker CLI and a reachable engine, kind and
kubectl, checked with one message naming everything missing; the Tools found."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass

from harness.backends.commands import run_quiet
from harness.backends.common import find_kubectl
from harness.binaries import kindtool
from harness.core.errors import HarnessError

KIND_MIN_VERSION = (0, 33, 0)
DOCKER_MIN_VERSION = (28, 0)  # `docker save --platform` needs Docker Engine 28 (API 1.48)


@dataclass(frozen=True)
class Tools:
    docker: str = "docker"
    kind: str = "kind"
    kubectl: str = "kubectl"
    python: str = sys.executable
    platform: str = "linux/amd64"  # of the Docker engine, so of the kind nodes
    env: dict | None = None  # the commands' environment: DOCKER_HOST of the harness's own dockerd
    save_platform: bool = True  # `docker save --platform` (Engine >= 28); older engines have one platform


def parse_version(text: str) -> tuple[int, ...] | None:
    match = re.search(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return tuple(int(part) for part in match.groups(default="0"))


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "s390x": "s390x",
           "ppc64le": "ppc64le"}


def preflight(*, which=shutil.which, run=run_quiet, kubectl_finder=None, env: dict | None = None) -> Tools:
    """Docker engine, kind and kubectl, or one HarnessError naming everything that is missing. With
    `env` (the harness's own dockerd): the engine is reached through it, and any version will do
    (Debian's 20.10 has no multi-platform image store, so `docker save` needs no --platform)."""
    missing: list[str] = []
    save_platform = True
    if env is not None:
        run = lambda argv, timeout=60: run_quiet(argv, timeout, env=env)  # noqa: E731
    docker = which("docker")
    platform = "linux/amd64"
    if not docker:
        missing.append("docker: the Docker CLI is not installed (kind runs its nodes as Docker containers)")
    else:
        info = run([docker, "info", "--format", "{{.ServerVersion}}|{{.OSType}}|{{.Architecture}}"], timeout=30)
        fields = (info.stdout or "").strip().split("|")
        server = parse_version(fields[0]) if info.returncode == 0 and fields and fields[0] else None
        if server is None:
            reason = (info.stderr or info.stdout or "").strip().splitlines()
            missing.append("Docker engine: not reachable (`docker info` failed"
                           + (f": {reason[-1]}" if reason else "") + "); start dockerd or point DOCKER_HOST at one")
        else:
            if server[:2] < DOCKER_MIN_VERSION and env is not None:
                save_platform = False
            elif server[:2] < DOCKER_MIN_VERSION:
                missing.append(f"Docker engine {_dotted(server)} is too old: need >= "
                               f"{_dotted(DOCKER_MIN_VERSION)} (for `docker save --platform`)")
            if len(fields) == 3 and fields[2]:
                platform = f"{fields[1] or 'linux'}/{GO_ARCH.get(fields[2], fields[2])}"
    kind = which("kind")
    if not kind:
        missing.append(f"kind: not installed; need kind >= v{_dotted(KIND_MIN_VERSION)} "
                       "(`dra-harness binaries install --kind` builds it into the cache; needs Go)")
    else:
        out = run([kind, "version"], timeout=30)
        version = parse_version(out.stdout) if out.returncode == 0 else None
        if version is None:
            missing.append(f"kind: `{kind} version` did not report a version ({(out.stderr or '').strip()[:200]})")
        elif version < KIND_MIN_VERSION:
            missing.append(f"kind v{_dotted(version)} is too old: need >= v{_dotted(KIND_MIN_VERSION)}, the first "
                           "release with Kubernetes 1.37 node images")
    kubectl = (kubectl_finder or (lambda: find_kubectl(which)))()
    if not kubectl:
        missing.append("kubectl: not installed (needed for `kubectl kustomize` and `kubectl apply`); "
                       "`dra-harness binaries install` provides one")
    if missing:
        raise HarnessError("the kind backend cannot run on this machine:\n  - " + "\n  - ".join(missing),
                           hint="see docs/kind-and-existing.md; without Docker use the local backend (the default)")
    assert kubectl  # a missing one was reported above
    return Tools(docker=docker, kind=kind, kubectl=kubectl, python=sys.executable, platform=platform, env=env,
                 save_platform=save_platform)


def which_with_cached_kind(name: str) -> str | None:
    """shutil.which, except that kind may also be the harness's cached build (binaries.kindtool)."""
    found = shutil.which(name)
    if found is None and name == "kind":
        cached = kindtool.locate()
        return str(cached) if cached else None
    return found

