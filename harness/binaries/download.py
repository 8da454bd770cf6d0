"""Source 2: official release binaries, verified against the checksums their projects publish.

Kubernetes publishes `<binary>.sha256` next to every binary; etcd publishes `SHA256SUMS` for its
release archives. KWOK publishes no checksum file, so in download mode KWOK is built with Go when Go
is present, or downloaded only when the user pins its SHA-256 (DRA_HARNESS_KWOK_SHA256).
The base URLs can be pointed at a mirror with environment variables (tests use a loopback server).
Nothing is moved into the cache before its checksum matched.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from harness.binaries import gobuild, manifest
from harness.binaries.versions import GROUPS, Versions, host_platform
from harness.core.errors import BinariesError
from harness.core.progress import Reporter

NAME = "download"
DESCRIPTION = "downloading official release binaries"

BASE_URLS = {
    "kubernetes": ("DRA_HARNESS_KUBERNETES_RELEASE_URL", "https://dl.k8s.io/release"),
    "etcd": ("DRA_HARNESS_ETCD_RELEASE_URL", "https://github.com/etcd-io/etcd/releases/download"),
    "kwok": ("DRA_HARNESS_KWOK_RELEASE_URL", "https://github.com/kubernetes-sigs/kwok/releases/download"),
}
KWOK_SHA_ENV = "DRA_HARNESS_KWOK_SHA256"
TIMEOUT = 60


def base_url(group: str) -> str:
    env, default = BASE_URLS[group]
    return os.environ.get(env, default).rstrip("/")


def reachable(group: str) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(base_url(group), method="HEAD"), timeout=5).close()
        return True
    except urllib.error.HTTPError:
        return True  # the server answered; a 403/404 on the bare base URL is fine
    except (OSError, ValueError):
        return False


def provide(group: str, versions: Versions, target: Path, reporter: Reporter) -> None:
    version = versions.of_group(group)
    with tempfile.TemporaryDirectory(dir=target, prefix=".download-") as tmp:
        staging = Path(tmp)
        if group == "kubernetes":
            _kubernetes(version, staging, reporter)
        elif group == "etcd":
            _etcd(version, staging, reporter)
        elif group == "kwok":
            _kwok(versions, staging, target, reporter)
            return
        else:
            raise BinariesError(f"unknown binary group {group!r}")
        for name in GROUPS[group]:
            manifest.install_file(staging / name, target / name)


def _kubernetes(version: str, staging: Path, reporter: Reporter) -> None:
    os_name, arch = host_platform()
    for name in GROUPS["kubernetes"]:
        url = f"{base_url('kubernetes')}/v{version}/bin/{os_name}/{arch}/{name}"
        expected = parse_sha256_file(fetch_bytes(url + ".sha256").decode(errors="replace"), None, url + ".sha256")
        fetch_verified(url, expected, staging / name, reporter)


def _etcd(version: str, staging: Path, reporter: Reporter) -> None:
    os_name, arch = host_platform()
    archive = f"etcd-v{version}-{os_name}-{arch}.tar.gz"
    release = f"{base_url('etcd')}/v{version}"
    sums_url = f"{release}/SHA256SUMS"
    expected = parse_sha256_file(fetch_bytes(sums_url).decode(errors="replace"), archive, sums_url)
    fetch_verified(f"{release}/{archive}", expected, staging / archive, reporter)
    extract_member(staging / archive, f"etcd-v{version}-{os_name}-{arch}/etcd", staging / "etcd")


def _kwok(versions: Versions, staging: Path, target: Path, reporter: Reporter) -> None:
    if gobuild.go_available():
        gobuild.provide("kwok", versions, target, reporter)
        return
    pinned = os.environ.get(KWOK_SHA_ENV, "").strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", pinned):
        raise BinariesError(
            "KWOK publishes no checksum file, so it is not downloaded unverified",
            hint=f"install Go (KWOK is then built from the Go module proxy), set {KWOK_SHA_ENV} to the "
                 "SHA-256 of the kwok release binary you trust, or pass --binaries-dir DIR")
    os_name, arch = host_platform()
    url = f"{base_url('kwok')}/v{versions.kwok}/kwok-{os_name}-{arch}"
    fetch_verified(url, pinned, staging / "kwok", reporter)
    manifest.install_file(staging / "kwok", target / "kwok")


def parse_sha256_file(text: str, member: str | None, url: str) -> str:
    """The hex digest from a `.sha256` file (member None) or the line for `member` in a SHA256SUMS file."""
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        digest = fields[0].lower()
        name = fields[1].lstrip("*") if len(fields) > 1 else None
        if (member is None or name == member) and re.fullmatch(r"[0-9a-f]{64}", digest):
            return digest
    wanted = f"no entry for {member}" if member else "no SHA-256 digest"
    raise BinariesError(f"checksum file {url} has {wanted}")


def fetch_bytes(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return response.read()
    except urllib.error.HTTPError as err:
        raise BinariesError(f"download of {url} failed: HTTP {err.code}") from None
    except (OSError, ValueError) as err:
        raise BinariesError(f"download of {url} failed: {err}",
                            hint="no internet here? build from the Go module proxy (--source build) "
                                 "or pass --binaries-dir DIR") from None


def fetch_verified(url: str, expected_sha256: str, dest: Path, reporter: Reporter) -> None:
    """Stream `url` to `dest`, hashing as it goes; delete it and fail unless the digest matches."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response, open(dest, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            with reporter.counter(f"downloading {url.rsplit('/', 1)[-1]} (MiB)", max(1, total >> 20)) as counter:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    counter.advance()
    except urllib.error.HTTPError as err:
        dest.unlink(missing_ok=True)
        raise BinariesError(f"download of {url} failed: HTTP {err.code}") from None
    except (OSError, ValueError) as err:
        dest.unlink(missing_ok=True)
        raise BinariesError(f"download of {url} failed: {err}") from None
    actual = digest.hexdigest()
    if actual != expected_sha256.lower():
        dest.unlink(missing_ok=True)
        raise BinariesError(f"checksum mismatch for {url}: published {expected_sha256}, downloaded file has {actual}",
                            hint="the file was corrupted or tampered with in transit; nothing was installed")


def extract_member(archive: Path, member: str, dest: Path) -> None:
    """Copy one regular file out of a tar.gz, refusing links and anything else."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            info = tar.getmember(member)
            if not info.isfile():
                raise BinariesError(f"{archive.name}: {member} is not a regular file")
            source = tar.extractfile(info)
            assert source is not None
            with source, open(dest, "wb") as out:
                shutil.copyfileobj(source, out)
    except KeyError:
        raise BinariesError(f"{archive.name} has no {member}") from None
    except (tarfile.TarError, OSError, EOFError, io.UnsupportedOperation) as err:
        raise BinariesError(f"cannot read {archive.name}: {err}") from None
