"""harness.binaries.download against a real HTTP server on 127.0.0.1 serving a fake release layout."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import socket
import stat
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import harness.binaries as binaries
from harness.binaries import GROUPS, KUBE_BINARIES, Versions, download, gobuild, host_platform
from harness.core.errors import BinariesError
from harness.core.progress import Reporter

KUBE_VERSION = "1.37.2"
ETCD_VERSION = "3.6.16"
KWOK_VERSION = "0.8.0"
VERSIONS = Versions(kubernetes=KUBE_VERSION, etcd=ETCD_VERSION, kwok=KWOK_VERSION)
OS_NAME, ARCH = host_platform()
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def binary_bytes(name: str) -> bytes:
    return b"#!/bin/sh\n# fake " + name.encode() + b"\n" + bytes(range(256))


class Release:
    """A fake release site: files under `root`, served by a loopback HTTP server; records request paths."""

    def __init__(self, root: Path, url: str, requests: list[str]):
        self.root = root
        self.url = url
        self.requests = requests

    def write(self, rel: str, data: bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    # --- Kubernetes: /v<ver>/bin/<os>/<arch>/<name> and <name>.sha256 --------------------------
    def kube_path(self, name: str, version: str = KUBE_VERSION) -> str:
        return f"v{version}/bin/{OS_NAME}/{ARCH}/{name}"

    def publish_kubernetes(self, version: str = KUBE_VERSION) -> dict[str, bytes]:
        contents = {name: binary_bytes(name) for name in KUBE_BINARIES}
        for name, data in contents.items():
            self.write(self.kube_path(name, version), data)
            self.write(self.kube_path(name, version) + ".sha256", sha(data).encode())  # dl.k8s.io: bare digest
        return contents

    # --- etcd: /v<ver>/SHA256SUMS and etcd-v<ver>-<os>-<arch>.tar.gz ----------------------------
    @staticmethod
    def etcd_archive_name(version: str = ETCD_VERSION) -> str:
        return f"etcd-v{version}-{OS_NAME}-{ARCH}.tar.gz"

    def publish_etcd(self, version: str = ETCD_VERSION, *, symlink: bool = False, include_member: bool = True,
                     sums_entry: bool = True) -> bytes:
        prefix = f"etcd-v{version}-{OS_NAME}-{ARCH}"
        etcd = binary_bytes("etcd")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            def add(name: str, data: bytes) -> None:
                info = tarfile.TarInfo(f"{prefix}/{name}")
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))

            add("etcdctl", binary_bytes("etcdctl"))
            if include_member and symlink:
                info = tarfile.TarInfo(f"{prefix}/etcd")
                info.type, info.linkname = tarfile.SYMTYPE, "/bin/sh"
                tar.addfile(info)
            elif include_member:
                add("etcd", etcd)
        archive = buf.getvalue()
        self.write(f"v{version}/{self.etcd_archive_name(version)}", archive)
        other = f"etcd-v{version}-windows-{ARCH}.zip"
        lines = [f"{sha(b'other archive')}  {other}"]
        if sums_entry:
            lines.append(f"{sha(archive)}  {self.etcd_archive_name(version)}")
        self.write(f"v{version}/SHA256SUMS", ("\n".join(lines) + "\n").encode())
        return etcd

    # --- KWOK: /v<ver>/kwok-<os>-<arch>, no checksum file ----------------------------------------
    def publish_kwok(self, version: str = KWOK_VERSION) -> bytes:
        data = binary_bytes("kwok")
        self.write(f"v{version}/kwok-{OS_NAME}-{ARCH}", data)
        return data


@pytest.fixture
def release(tmp_path, monkeypatch):
    for var in PROXY_VARS:  # urllib honours proxy variables; keep every request on loopback
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    root = tmp_path / "www"
    root.mkdir()
    requests: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - quiet test output
            pass

        def send_head(self):
            requests.append(self.path)
            return super().send_head()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    # A short poll interval: shutdown() waits for the serving loop to notice, up to one interval.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    for env, _default in download.BASE_URLS.values():
        monkeypatch.setenv(env, url + "/")  # trailing slash: base_url must strip it
    try:
        yield Release(root, url, requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def target(tmp_path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def no_go(monkeypatch):
    monkeypatch.setattr(gobuild, "go_available", lambda: False)


def quiet() -> Reporter:
    return Reporter(quiet=True)


def assert_installed(target: Path, expected: dict[str, bytes]) -> None:
    assert sorted(os.listdir(target)) == sorted(expected)  # nothing else: no temp file or staging dir
    for name, data in expected.items():
        path = target / name
        assert path.read_bytes() == data
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o111 == 0o111, f"{name} is not executable: {oct(mode)}"


# --- Kubernetes ---------------------------------------------------------------------------------

def test_kubernetes_installed_when_checksums_match(release, target):
    contents = release.publish_kubernetes()
    download.provide("kubernetes", VERSIONS, target, quiet())
    assert_installed(target, contents)
    for name in KUBE_BINARIES:
        assert f"/{release.kube_path(name)}.sha256" in release.requests
        assert f"/{release.kube_path(name)}" in release.requests


@pytest.mark.parametrize("tampered", [KUBE_BINARIES[0], KUBE_BINARIES[-1]])
def test_kubernetes_tampered_binary_installs_nothing(release, target, tampered):
    release.publish_kubernetes()
    path = release.root / release.kube_path(tampered)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # same size, one bit differs
    path.write_bytes(bytes(data))

    with pytest.raises(BinariesError) as caught:
        download.provide("kubernetes", VERSIONS, target, quiet())
    assert "checksum mismatch" in str(caught.value)
    assert tampered in str(caught.value)
    assert "nothing was installed" in (caught.value.hint or "")
    assert os.listdir(target) == []  # not the good binaries before it, not a partial file, not the staging dir


def test_kubernetes_missing_checksum_file_names_url(release, target):
    release.publish_kubernetes()
    (release.root / (release.kube_path("kubelet") + ".sha256")).unlink()

    with pytest.raises(BinariesError) as caught:
        download.provide("kubernetes", VERSIONS, target, quiet())
    message = str(caught.value)
    assert f"{release.url}/{release.kube_path('kubelet')}.sha256" in message
    assert "HTTP 404" in message
    assert os.listdir(target) == []


def test_kubernetes_missing_binary_installs_nothing(release, target):
    release.publish_kubernetes()
    (release.root / release.kube_path("kubectl")).unlink()

    with pytest.raises(BinariesError) as caught:
        download.provide("kubernetes", VERSIONS, target, quiet())
    assert f"{release.url}/{release.kube_path('kubectl')}" in str(caught.value)
    assert "HTTP 404" in str(caught.value)
    assert os.listdir(target) == []


def test_kubernetes_garbage_checksum_file(release, target):
    release.publish_kubernetes()
    release.write(release.kube_path("kube-scheduler") + ".sha256", b"<html>not found</html>\n")

    with pytest.raises(BinariesError) as caught:
        download.provide("kubernetes", VERSIONS, target, quiet())
    assert f"{release.kube_path('kube-scheduler')}.sha256" in str(caught.value)
    assert os.listdir(target) == []


# --- etcd ---------------------------------------------------------------------------------------

def test_etcd_installed_from_verified_archive(release, target):
    etcd = release.publish_etcd()
    download.provide("etcd", VERSIONS, target, quiet())
    assert_installed(target, {"etcd": etcd})  # only the etcd binary, not etcdctl or the archive


def test_etcd_sums_without_archive_entry(release, target):
    release.publish_etcd(sums_entry=False)

    with pytest.raises(BinariesError) as caught:
        download.provide("etcd", VERSIONS, target, quiet())
    message = str(caught.value)
    assert release.etcd_archive_name() in message
    assert f"{release.url}/v{ETCD_VERSION}/SHA256SUMS" in message
    assert os.listdir(target) == []


def test_etcd_tampered_archive(release, target):
    release.publish_etcd()
    path = release.root / f"v{ETCD_VERSION}" / release.etcd_archive_name()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    with pytest.raises(BinariesError) as caught:
        download.provide("etcd", VERSIONS, target, quiet())
    assert "checksum mismatch" in str(caught.value)
    assert os.listdir(target) == []


def test_etcd_symlink_member_is_refused(release, target):
    release.publish_etcd(symlink=True)

    with pytest.raises(BinariesError) as caught:
        download.provide("etcd", VERSIONS, target, quiet())
    assert "not a regular file" in str(caught.value)
    assert os.listdir(target) == []


def test_etcd_archive_without_member(release, target):
    release.publish_etcd(include_member=False)

    with pytest.raises(BinariesError) as caught:
        download.provide("etcd", VERSIONS, target, quiet())
    assert f"etcd-v{ETCD_VERSION}-{OS_NAME}-{ARCH}/etcd" in str(caught.value)
    assert os.listdir(target) == []


def test_extract_member_rejects_non_gzip(tmp_path):
    archive = tmp_path / "bad.tar.gz"
    archive.write_bytes(b"this is not a tar.gz")
    with pytest.raises(BinariesError) as caught:
        download.extract_member(archive, "x/etcd", tmp_path / "etcd")
    assert "cannot read bad.tar.gz" in str(caught.value)


# --- KWOK ---------------------------------------------------------------------------------------

def test_kwok_without_go_or_pinned_sha_is_refused(release, target, no_go, monkeypatch):
    release.publish_kwok()
    monkeypatch.delenv(download.KWOK_SHA_ENV, raising=False)

    with pytest.raises(BinariesError) as caught:
        download.provide("kwok", VERSIONS, target, quiet())
    assert "DRA_HARNESS_KWOK_SHA256" in (caught.value.hint or "")
    assert not any("kwok" in path for path in release.requests)  # never downloaded unverified
    assert os.listdir(target) == []


def test_kwok_malformed_pinned_sha_is_refused(release, target, no_go, monkeypatch):
    release.publish_kwok()
    monkeypatch.setenv(download.KWOK_SHA_ENV, "not-a-sha256")

    with pytest.raises(BinariesError) as caught:
        download.provide("kwok", VERSIONS, target, quiet())
    assert "DRA_HARNESS_KWOK_SHA256" in (caught.value.hint or "")
    assert os.listdir(target) == []


def test_kwok_with_matching_pinned_sha_is_installed(release, target, no_go, monkeypatch):
    data = release.publish_kwok()
    monkeypatch.setenv(download.KWOK_SHA_ENV, f"  {sha(data).upper()}\n")  # case and whitespace tolerated

    download.provide("kwok", VERSIONS, target, quiet())
    assert_installed(target, {"kwok": data})
    assert f"/v{KWOK_VERSION}/kwok-{OS_NAME}-{ARCH}" in release.requests


def test_kwok_with_wrong_pinned_sha_installs_nothing(release, target, no_go, monkeypatch):
    release.publish_kwok()
    monkeypatch.setenv(download.KWOK_SHA_ENV, sha(b"something else"))

    with pytest.raises(BinariesError) as caught:
        download.provide("kwok", VERSIONS, target, quiet())
    assert "checksum mismatch" in str(caught.value)
    assert os.listdir(target) == []


def test_kwok_is_built_when_go_is_available(release, target, monkeypatch):
    calls = []
    monkeypatch.setattr(gobuild, "go_available", lambda: True)
    monkeypatch.setattr(gobuild, "provide", lambda *args: calls.append(args))

    reporter = quiet()
    download.provide("kwok", VERSIONS, target, reporter)
    assert calls == [("kwok", VERSIONS, target, reporter)]
    assert release.requests == []


# --- the whole path through ensure(source="download") ------------------------------------------

def test_ensure_download_end_to_end(release, tmp_path, no_go, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_CACHE_DIR", str(tmp_path / "xdg-cache"))
    kube = release.publish_kubernetes()
    etcd = release.publish_etcd()
    kwok = release.publish_kwok()
    monkeypatch.setenv(download.KWOK_SHA_ENV, sha(kwok))

    got = binaries.ensure(VERSIONS, source="download", reporter=quiet())
    assert got.directory == binaries.cache_dir(VERSIONS)
    assert got.directory.is_relative_to(tmp_path / "xdg-cache")
    for name, data in {**kube, "etcd": etcd, "kwok": kwok}.items():
        assert got.path(name).read_bytes() == data
    recorded = json.loads((got.directory / "manifest.json").read_text())
    assert {g: recorded["groups"][g]["source"] for g in GROUPS} == {g: "download" for g in GROUPS}
    assert recorded["groups"]["kubernetes"]["files"]["kubelet"]["sha256"] == sha(kube["kubelet"])

    # Verified cache: no request at all the second time.
    release.requests.clear()
    binaries.ensure(VERSIONS, source="download", reporter=quiet())
    assert release.requests == []

    # A corrupt cached kubelet: only the Kubernetes group is downloaded again.
    cached = got.path("kubelet")
    data = bytearray(cached.read_bytes())
    data[0] ^= 0x20
    cached.write_bytes(bytes(data))
    binaries.ensure(VERSIONS, source="download", reporter=quiet())
    assert cached.read_bytes() == kube["kubelet"]
    assert release.requests and all(p.startswith(f"/v{KUBE_VERSION}/bin/") for p in release.requests)


# --- reachable / fetch_bytes --------------------------------------------------------------------

def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_reachable_when_server_answers_even_with_404(release, monkeypatch):
    assert download.reachable("kubernetes")
    monkeypatch.setenv("DRA_HARNESS_ETCD_RELEASE_URL", release.url + "/no/such/path")
    assert download.reachable("etcd")
    assert "/no/such/path" in release.requests


def test_not_reachable_when_nothing_listens(monkeypatch):
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DRA_HARNESS_KUBERNETES_RELEASE_URL", f"http://127.0.0.1:{closed_port()}")
    assert not download.reachable("kubernetes")


def test_fetch_bytes_connection_refused_has_hint(monkeypatch):
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    url = f"http://127.0.0.1:{closed_port()}/v1/SHA256SUMS"
    with pytest.raises(BinariesError) as caught:
        download.fetch_bytes(url)
    assert url in str(caught.value)
    assert "--binaries-dir" in (caught.value.hint or "")


def test_base_url_default_and_override(monkeypatch):
    monkeypatch.delenv("DRA_HARNESS_KUBERNETES_RELEASE_URL", raising=False)
    assert download.base_url("kubernetes") == "https://dl.k8s.io/release"
    monkeypatch.setenv("DRA_HARNESS_KUBERNETES_RELEASE_URL", "http://mirror.invalid/k8s///")
    assert download.base_url("kubernetes") == "http://mirror.invalid/k8s"


# --- parse_sha256_file --------------------------------------------------------------------------

DIGEST_A = sha(b"a")
DIGEST_B = sha(b"b")


def test_parse_single_digest_file():
    assert download.parse_sha256_file(DIGEST_A, None, "u") == DIGEST_A
    assert download.parse_sha256_file(f"\n{DIGEST_A.upper()}\n", None, "u") == DIGEST_A
    assert download.parse_sha256_file(f"{DIGEST_A}  kubelet\n", None, "u") == DIGEST_A


def test_parse_sha256sums_picks_the_members_line():
    text = f"{DIGEST_A}  etcd-v3.6.16-darwin-arm64.zip\n{DIGEST_B} *etcd-v3.6.16-linux-amd64.tar.gz\n"
    assert download.parse_sha256_file(text, "etcd-v3.6.16-linux-amd64.tar.gz", "u") == DIGEST_B
    assert download.parse_sha256_file(text, "etcd-v3.6.16-darwin-arm64.zip", "u") == DIGEST_A
    with pytest.raises(BinariesError) as caught:
        download.parse_sha256_file(text, "etcd-v3.6.16-linux-arm64.tar.gz", "http://x/SHA256SUMS")
    assert "etcd-v3.6.16-linux-arm64.tar.gz" in str(caught.value)
    assert "http://x/SHA256SUMS" in str(caught.value)


def test_parse_does_not_match_member_by_prefix():
    text = f"{DIGEST_A}  etcd-v3.6.16-linux-amd64.tar.gz.asc\n"
    with pytest.raises(BinariesError):
        download.parse_sha256_file(text, "etcd-v3.6.16-linux-amd64.tar.gz", "u")


@pytest.mark.parametrize("text", [
    "",
    "\n\n",
    "<html><body>404 Not Found</body></html>",
    DIGEST_A[:-1],          # 63 hex digits
    DIGEST_A + "0",         # 65 hex digits
    "g" * 64,               # not hex
])
def test_parse_garbage_is_an_error(text):
    with pytest.raises(BinariesError) as caught:
        download.parse_sha256_file(text, None, "http://mirror/kubelet.sha256")
    assert "http://mirror/kubelet.sha256" in str(caught.value)
