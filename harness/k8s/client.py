"""API clients built from a kubeconfig, the kubeconfig's own checks, and translation of client errors
into harness errors."""

from __future__ import annotations

import base64
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import kubernetes
import urllib3
import yaml

from fake_devices import keyfiles
from harness.core.errors import ConfigError, Problem
from harness.k8s import errors

# A kubeconfig is a few KiB; anything much bigger is not one (a log, /dev/zero), and is not read whole.
MAX_KUBECONFIG_BYTES = 4 << 20
PROBE_TIMEOUT = 5.0


def read_kubeconfig(path: Path | str, where: str = "--kubeconfig") -> dict:
    """Check a kubeconfig file before anything uses it; return its current context's cluster entry.

    Every refusal is a ConfigError naming `where` (the flag or variable it came from), the file, the
    field and what is wanted; nothing is contacted here."""
    path = Path(path).expanduser()

    def refuse(field: str, problem: str, allowed: str | None = None) -> ConfigError:
        return ConfigError([Problem(f"{where} {path}", field, problem, allowed)])

    if not path.exists():
        raise refuse("(file)", "does not exist", "the path of a kubeconfig file")
    if not path.is_file():
        raise refuse("(file)", "is not a regular file", "the path of a kubeconfig file")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_KUBECONFIG_BYTES + 1)
    except OSError as err:
        raise refuse("(file)", f"cannot read: {err.strerror}") from None
    if len(raw) > MAX_KUBECONFIG_BYTES:
        raise refuse("(file)", f"larger than {MAX_KUBECONFIG_BYTES >> 20} MiB", "a kubeconfig file") from None
    try:
        config = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise refuse("(file)", f"not YAML: {' '.join(str(err).split())[:200]}", "a kubeconfig file") from None
    if not isinstance(config, dict):
        raise refuse("(file)", "empty" if config is None else f"not a mapping but {type(config).__name__}",
                     "a kubeconfig (kind: Config, clusters, users, contexts, current-context)")

    def named(section: str, name) -> dict | None:
        entries = config.get(section)
        if not isinstance(entries, list):
            return None
        return next((e for e in entries if isinstance(e, dict) and e.get("name") == name), None)

    current = config.get("current-context")
    if not isinstance(current, str) or not current:
        raise refuse("current-context", "missing", "the name of one of the file's contexts")
    context = (named("contexts", current) or {}).get("context")
    if not isinstance(context, dict):
        raise refuse("contexts", f"no context named {current!r} (the current-context)")
    cluster = (named("clusters", context.get("cluster")) or {}).get("cluster")
    if not isinstance(cluster, dict):
        raise refuse(f"contexts[{current}].context.cluster", f"no cluster named {context.get('cluster')!r}",
                     "the name of one of the file's clusters")
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise refuse(f"clusters[{context.get('cluster')}].cluster.server", f"{server!r} is not a URL",
                     "https://HOST:PORT")
    try:  # what the client library itself will refuse (a bad certificate, an unknown auth provider)
        keyfiles.load_configuration(path)
    except (kubernetes.config.ConfigException, ValueError, TypeError, OSError) as err:
        raise refuse("(file)", f"not usable by the Kubernetes client: {' '.join(str(err).split())[:200]}") from None
    return {"name": current, "server": server}


def check_reachable(clients: "Clients", where: str) -> None:
    """Ask the API server its version. A kubeconfig whose server does not answer, or does not accept
    its credentials, is refused like any other bad input (ConfigError naming `where` and the server)."""
    try:
        clients.version.get_code(_request_timeout=PROBE_TIMEOUT)
    except errors.ApiError as err:
        answer = f"{err.status} {err.reason}"
        problem = (f"the API server {clients.server} does not accept these credentials ({answer})"
                   if err.status in (401, 403) else f"the API server {clients.server} answered {answer}")
        raise ConfigError([Problem(where, "users", problem, "a kubeconfig with working credentials")]) from None
    except (urllib3.exceptions.HTTPError, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise ConfigError([Problem(where, "clusters.cluster.server", f"cannot reach the API server {clients.server}: "
                                   f"{' '.join(str(reason).split())[:300]}",
                                   "the kubeconfig of a running cluster")]) from None


def connect(kubeconfig: Path | str, where: str = "--kubeconfig") -> "Clients":
    """Clients for a checked kubeconfig whose API server answered."""
    read_kubeconfig(kubeconfig, where)
    clients = Clients(Path(kubeconfig).expanduser())
    try:
        check_reachable(clients, f"{where} {kubeconfig}")
    except BaseException:
        clients.close()
        raise
    return clients


@dataclass
class Clients:
    """Typed API groups for one cluster, created lazily from one ApiClient."""

    kubeconfig: Path

    @cached_property
    def api_client(self) -> kubernetes.client.ApiClient:
        config = keyfiles.load_configuration(self.kubeconfig)
        config.connection_pool_maxsize = 32  # node creation and watches run on several threads
        return kubernetes.client.ApiClient(config)

    @cached_property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api_client)

    @cached_property
    def resource(self) -> kubernetes.client.ResourceV1Api:
        return kubernetes.client.ResourceV1Api(self.api_client)

    @cached_property
    def scheduling(self) -> kubernetes.client.SchedulingV1beta1Api:
        return kubernetes.client.SchedulingV1beta1Api(self.api_client)

    @cached_property
    def rbac(self) -> kubernetes.client.RbacAuthorizationV1Api:
        return kubernetes.client.RbacAuthorizationV1Api(self.api_client)

    @cached_property
    def version(self) -> kubernetes.client.VersionApi:
        return kubernetes.client.VersionApi(self.api_client)

    @cached_property
    def server(self) -> str:
        return self.api_client.configuration.host

    @cached_property
    def tls(self) -> ssl.SSLContext:
        return tls_context(self.kubeconfig)

    def get_raw(self, path: str, server: str | None = None) -> str:
        """GET a non-resource path (/metrics, /readyz) from the apiserver, or from another secure
        endpoint of the cluster (scheduler, controller-manager) with the same credentials."""
        url = (server or self.server) + path
        status, body = https_get(url, self.tls)
        if status != 200:
            raise errors.from_status(status, f"GET {url}: {body[:200]}")
        return body

    def check_before_each_call(self, check: Callable[[], None]) -> None:
        """Call `check` before every request these clients send (watches included); it raises to refuse one."""
        send = self.api_client.call_api

        def checked(*args, **kwargs):
            check()
            return send(*args, **kwargs)

        self.api_client.call_api = checked

    def close(self) -> None:
        if "api_client" in self.__dict__:
            self.api_client.close()


def tls_context(kubeconfig: Path) -> ssl.SSLContext:
    """An SSL context with the kubeconfig's CA and client certificate, for endpoints the client does
    not cover (the scheduler's and controller-manager's secure ports)."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    context_name = config["current-context"]
    ctx = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
    context = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp, "c.crt"), Path(tmp, "c.key")
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        context.load_cert_chain(cert, key)
    return context


def https_get(url: str, context: ssl.SSLContext | None, timeout: float = 30.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
