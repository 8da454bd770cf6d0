"""A kubeconfig is checked before anything uses it (issue 16, item 6): every refusal names the flag, the
file, the field and what is wanted; an unreachable server is refused the same way."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.errors import ComponentDied, ConfigError
from harness.k8s.client import MAX_KUBECONFIG_BYTES, Clients, check_reachable, read_kubeconfig

GOOD = ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'SERVER', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")


def _refusal(path, where="--kubeconfig"):
    with pytest.raises(ConfigError) as caught:
        read_kubeconfig(path, where)
    (problem,) = caught.value.problems
    assert problem.source == f"{where} {path}"
    return problem


def test_good_kubeconfig_gives_its_current_cluster(tmp_path):
    path = tmp_path / "kc"
    path.write_text(GOOD.replace("SERVER", "https://127.0.0.1:6443"))
    assert read_kubeconfig(path) == {"name": "c", "server": "https://127.0.0.1:6443"}


@pytest.mark.parametrize("content, field, fragment", [
    ("", "(file)", "empty"),
    (b"\xff\xfe\x00binary", "(file)", "not YAML"),
    ("a: [b", "(file)", "not YAML"),
    ("42", "(file)", "not a mapping but int"),
    ("apiVersion: v1\n", "current-context", "missing"),
    ("current-context: x\ncontexts: 7\n", "contexts", "no context named 'x'"),
    (GOOD.replace("cluster: k, user", "cluster: gone, user"), "contexts[c].context.cluster", "no cluster named 'gone'"),
    (GOOD.replace("'SERVER'", "12"), "clusters[k].cluster.server", "12 is not a URL"),
    (GOOD.replace("SERVER", "https://127.0.0.1:6443").replace("insecure-skip-tls-verify: true",
                                                               "certificate-authority: /no/such/ca"),
     "(file)", "not usable by the Kubernetes client"),
])
def test_broken_kubeconfigs_are_refused_with_their_field(tmp_path, content, field, fragment):
    path = tmp_path / "kc"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    problem = _refusal(path)
    assert problem.field == field and fragment in problem.problem, problem


def test_missing_directory_and_huge_files_are_refused_without_reading_them(tmp_path):
    assert _refusal(tmp_path / "nope").problem == "does not exist"
    assert _refusal(tmp_path).problem == "is not a regular file"
    assert _refusal(Path("/dev/zero")).problem == "is not a regular file"
    huge = tmp_path / "huge"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_KUBECONFIG_BYTES + 10)
    assert _refusal(huge, "$KUBECONFIG").problem.startswith("larger than")


def test_unreachable_server_is_refused_naming_it(tmp_path):
    with socket.socket() as sock:  # bound but not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        server = f"https://127.0.0.1:{sock.getsockname()[1]}"
        path = tmp_path / "kc"
        path.write_text(GOOD.replace("SERVER", server))
        clients = Clients(path)
        with pytest.raises(ConfigError) as caught:
            check_reachable(clients, f"--kubeconfig {path}")
        clients.close()
    (problem,) = caught.value.problems
    assert problem.problem.startswith(f"cannot reach the API server {server}")
    assert problem.allowed == "the kubeconfig of a running cluster"


def test_a_check_before_each_call_refuses_requests_once_it_raises():
    sent = []
    clients = Clients(Path("unused"))
    clients.__dict__["api_client"] = SimpleNamespace(call_api=lambda *args, **kwargs: sent.append(args) or "ok")
    dead = []

    def check():
        if dead:
            raise ComponentDied("etcd", "is no longer running")

    clients.check_before_each_call(check)
    assert clients.api_client.call_api("GET", "/api") == "ok"
    dead.append(True)
    with pytest.raises(ComponentDied, match="etcd"):
        clients.api_client.call_api("GET", "/api/v1/pods")
    assert sent == [("GET", "/api")]  # the refused request was never sent
