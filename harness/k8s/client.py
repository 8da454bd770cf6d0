"""API clients built from a kubeconfig, and translation of client errors into harness errors."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import kubernetes
import yaml
from kubernetes.client.rest import ApiException


@dataclass
class Clients:
    """Typed API groups for one cluster, created lazily from one ApiClient."""

    kubeconfig: Path

    @cached_property
    def api_client(self) -> kubernetes.client.ApiClient:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=config)
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
            raise ApiException(status=status, reason=f"GET {url}: {body[:200]}")
        return body

    def close(self) -> None:
        if "api_client" in self.__dict__:
            self.api_client.close()


def tls_context(kubeconfig: Path) -> ssl.SSLContext:
    """An SSL context with the kubeconfig's CA and client certificate, for endpoints the client does
    not cover (the scheduler's and controller-manager's secure ports)."""
    import base64
    import tempfile

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


def https_get(url: str, context: ssl.SSLContext | None, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
