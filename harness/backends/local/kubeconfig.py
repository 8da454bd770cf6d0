"""kubeconfig files with the certificates embedded, so they can be copied anywhere on the machine."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from harness.backends.local.pki import Pki


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render(cluster_name: str, server: str, pki: Pki, client: str) -> str:
    context = f"dra-harness-{cluster_name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server,
                                                    "certificate-authority-data": _b64(pki.ca_cert)}}],
        "users": [{"name": f"{context}-{client}", "user": {
            "client-certificate-data": _b64(pki.client_cert(client)),
            "client-key-data": _b64(pki.client_key(client))}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": f"{context}-{client}"}}],
        "current-context": context,
    }
    return yaml.safe_dump(config, sort_keys=False)


def write(path: Path, cluster_name: str, server: str, pki: Pki, client: str) -> Path:
    path.write_text(render(cluster_name, server, pki, client))
    path.chmod(0o600)
    return path
