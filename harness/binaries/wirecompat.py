"""Build (once) and run the Go wire-compatibility client in tests/wirecompat.

The client uses the kubelet's own generated gRPC code (k8s.io/kubelet v0.37.2) and the CDI library
of container runtimes, so it is the ground truth for "a kubelet could talk to this plugin". Its
binary is cached under `<cache>/wirecompat/<key>/` where the key hashes go.mod, go.sum and the Go
sources: reruns (and CI reruns on the same machine) skip the build, any change rebuilds. A cold
build downloads the modules and compiles ~300 packages (a few minutes on two cores), with progress.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.core import paths
from harness.core.errors import HarnessError
from harness.core.locking import file_lock
from harness.core.progress import Reporter

SOURCE_DIR = Path(__file__).resolve().parents[2] / "tests" / "wirecompat"
BINARY = "wirecompat"


def source_key(source: Path = SOURCE_DIR) -> str:
    digest = hashlib.sha256()
    for path in sorted([source / "go.mod", source / "go.sum", *source.glob("*.go")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cached_binary(source: Path = SOURCE_DIR) -> Path:
    return paths.cache_root() / "wirecompat" / source_key(source) / BINARY


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    # -mod=readonly: go.sum is committed and must be complete; a build never rewrites it.
    env.update({"CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false", "GO111MODULE": "on"})
    return env


def build(reporter: Reporter | None = None, source: Path = SOURCE_DIR) -> Path:
    """The client binary, built now if this source version is not cached yet."""
    target = cached_binary(source)
    if target.exists():
        return target
    if shutil.which("go") is None:
        raise HarnessError("`go` is not on PATH: cannot build the wire-compatibility client",
                           hint="install Go >= 1.22 (the module's toolchain line fetches the Go it needs)")
    reporter = reporter or Reporter()
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / "lock"):  # parallel test workers build it once
        if target.exists():
            return target
        log = target.parent / "build.log"
        with reporter.step("downloading Go modules for the wire-compatibility client"):
            _run(["go", "mod", "download"], source, log)
        packages = _run(["go", "list", "-deps", "."], source, log).split()
        out = Path(tempfile.mkdtemp(dir=target.parent, prefix="out-"))
        try:
            with open(log, "a") as handle, reporter.counter("compiling the wire-compatibility client",
                                                            max(1, len(packages))) as counter:
                cmd = ["go", "build", "-v", "-trimpath", "-o", str(out / BINARY), "."]
                handle.write(f"\n$ {' '.join(cmd)}\n")
                handle.flush()
                proc = subprocess.Popen(cmd, cwd=source, env=go_env(), stdout=handle, stderr=subprocess.PIPE,
                                        text=True)
                assert proc.stderr is not None
                for line in proc.stderr:  # `go build -v` names each package as it compiles it
                    handle.write(line)
                    counter.advance()
                if proc.wait() != 0:
                    raise HarnessError(f"building the wire-compatibility client failed (see {log})",
                                       hint=_tail(log))
            os.replace(out / BINARY, target)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    for stale in target.parent.parent.iterdir():  # builds of older sources are never used again
        if stale != target.parent and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return target


def run(binary: Path, plan: dict, *, bench: int = 0, timeout: float = 300) -> tuple[int, dict, str]:
    """Run the client with `plan`; returns (exit code, JSON summary, stderr)."""
    cmd = [str(binary), "-plan", "-"]
    if bench:
        cmd += ["-bench", str(bench)]
    proc = subprocess.run(cmd, input=json.dumps(plan), capture_output=True, text=True, timeout=timeout)
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        summary = {"ok": False, "mismatches": [f"no JSON summary; stdout: {proc.stdout[:2000]!r}"]}
    return proc.returncode, summary, proc.stderr


def _run(cmd: list[str], cwd: Path, log: Path) -> str:
    with open(log, "a") as handle:
        handle.write(f"\n$ {' '.join(cmd)}\n")
        handle.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=go_env(), stdout=subprocess.PIPE, stderr=handle, text=True)
    if proc.returncode != 0:
        raise HarnessError(f"`{' '.join(cmd)}` failed in {cwd} (see {log})", hint=_tail(log))
    return proc.stdout


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "last lines of the build log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main() -> int:
    """`python -m harness.binaries.wirecompat`: build the client now (make test does, before the tests run, so
    a cold build does not compete with timing-sensitive tests for the two cores)."""
    if shutil.which("go") is None:
        print("wire-compatibility client not built: `go` is not on PATH (its tests will be skipped)", file=sys.stderr)
        return 0
    try:
        print(build(Reporter()))
    except HarnessError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
