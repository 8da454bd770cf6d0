"""Source 1: build the binaries from the Go module proxy with the installed Go toolchain.

`k8s.io/kubernetes` cannot be `go install`ed: its go.mod replaces every staging module
(`k8s.io/api`, `k8s.io/client-go`, ...) with a local path. We generate a small wrapper module that
requires `k8s.io/kubernetes vX.Y.Z`, replaces each staging module with its published `v0.Y.Z`, and
builds the commands from there with the version ldflags the release build sets. etcd's server module
has the same shape (its sibling modules are replaced by `../` paths). KWOK has no replaces and is a
plain `go install`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.binaries import manifest
from harness.binaries.versions import GROUPS, Versions
from harness.core import paths
from harness.core.errors import BinariesError
from harness.core.progress import Reporter

NAME = "build"
DESCRIPTION = "building from the Go module proxy"
MIN_GO = (1, 22)  # older Go cannot switch to the toolchain a module asks for (GOTOOLCHAIN)

KUBE_PACKAGES = {name: f"k8s.io/kubernetes/cmd/{name}" for name in GROUPS["kubernetes"]}
ETCD_MODULE = "go.etcd.io/etcd/server/v3"
KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"


def go_version() -> tuple[int, int] | None:
    go = shutil.which("go")
    if not go:
        return None
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"go(\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2])) if match else None


def go_available() -> bool:
    version = go_version()
    return version is not None and version >= MIN_GO


def require_go() -> None:
    version = go_version()
    if version is None:
        raise BinariesError("`go` is not on PATH, so binaries cannot be built from the Go module proxy",
                            hint="install Go >= 1.22, use --source download, or pass --binaries-dir DIR")
    if version < MIN_GO:
        raise BinariesError(f"Go {version[0]}.{version[1]} is too old to build Kubernetes",
                            hint="install Go >= 1.22 (it fetches the toolchain the modules need)")


def provide(group: str, versions: Versions, target: Path, reporter: Reporter) -> None:
    require_go()
    version = versions.of_group(group)
    work = paths.cache_root() / "build" / f"{group}-v{version}"
    work.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(dir=work, prefix="out-"))
    try:
        if group == "kubernetes":
            _build_kubernetes(version, work, out, reporter)
        elif group == "etcd":
            _build_etcd(version, work, out, reporter)
        elif group == "kwok":
            _build_kwok(version, work, out, reporter)
        else:
            raise BinariesError(f"unknown binary group {group!r}")
        for name in GROUPS[group]:
            manifest.install_file(out / name, target / name)
    finally:
        shutil.rmtree(out, ignore_errors=True)


# --- Kubernetes -------------------------------------------------------------------------------

def staging_replacements(gomod_text: str) -> list[str]:
    """The modules that k8s.io/kubernetes replaces with ./staging paths."""
    return sorted(set(re.findall(r"^\s*(?:replace\s+)?(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", gomod_text, re.M)))


def go_directive(gomod_text: str) -> str:
    match = re.search(r"^go\s+(\S+)", gomod_text, re.M)
    return match[1] if match else "1.22"


def kubernetes_wrapper_gomod(version: str, gomod_text: str) -> str:
    """go.mod of the wrapper module for k8s.io/kubernetes v<version>."""
    staging_version = "v0." + version.split(".", 1)[1]  # 1.37.2 -> v0.37.2
    lines = ["module dra-harness.local/kubernetes-build", "", f"go {go_directive(gomod_text)}", "",
             f"require k8s.io/kubernetes v{version}", ""]
    lines += [f"replace {module} => {module} {staging_version}" for module in staging_replacements(gomod_text)]
    return "\n".join(lines) + "\n"


def kubernetes_ldflags(version: str, build_date: str) -> str:
    major, minor = version.split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion=v{version}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}",
                  f"-X {pkg}.gitTreeState=clean", f"-X {pkg}.buildDate={build_date}"]
    return " ".join(flags)


def build_kubernetes_commands(version: str, names: tuple[str, ...], work: Path, out: Path,
                              reporter: Reporter) -> None:
    """Build any commands of k8s.io/kubernetes v<version> (e.g. kubeadm and kube-proxy for a kind node
    image) into `out`, with the same wrapper module and version ldflags as the cluster binaries."""
    require_go()
    work.mkdir(parents=True, exist_ok=True)
    _build_kubernetes(version, work, out, reporter, {name: f"k8s.io/kubernetes/cmd/{name}" for name in names})


def _build_kubernetes(version: str, work: Path, out: Path, reporter: Reporter,
                      packages: dict[str, str] = KUBE_PACKAGES) -> None:
    info = download_module(f"k8s.io/kubernetes@v{version}", work)
    gomod_text = Path(info["GoMod"]).read_text()
    if not staging_replacements(gomod_text):
        raise BinariesError(f"k8s.io/kubernetes v{version}: go.mod has no staging replacements; "
                            "this version's layout is not supported")
    module = work / "module"
    module.mkdir(exist_ok=True)
    (module / "go.mod").write_text(kubernetes_wrapper_gomod(version, gomod_text))
    (module / "go.sum").unlink(missing_ok=True)
    _write_tools_file(module, packages.values())
    _go(["mod", "tidy"], module, work, "resolving modules")
    build_date = _module_time(info)
    run_go_build(list(packages.values()), ["-ldflags", kubernetes_ldflags(version, build_date), "-o", str(out) + "/"],
              module, work, reporter, f"compiling Kubernetes v{version}")


# --- etcd -------------------------------------------------------------------------------------

def etcd_wrapper_gomod(version: str, gomod_text: str) -> str:
    siblings = sorted(set(re.findall(r"^\s*(?:replace\s+)?(go\.etcd\.io/etcd/[\w./-]+)\s+=>\s+\.\./", gomod_text, re.M)))
    lines = ["module dra-harness.local/etcd-build", "", f"go {go_directive(gomod_text)}", "",
             f"require {ETCD_MODULE} v{version}", ""]
    lines += [f"replace {module} => {module} v{version}" for module in siblings]
    return "\n".join(lines) + "\n"


def _build_etcd(version: str, work: Path, out: Path, reporter: Reporter) -> None:
    info = download_module(f"{ETCD_MODULE}@v{version}", work)
    module = work / "module"
    module.mkdir(exist_ok=True)
    (module / "go.mod").write_text(etcd_wrapper_gomod(version, Path(info["GoMod"]).read_text()))
    (module / "go.sum").unlink(missing_ok=True)
    _write_tools_file(module, [ETCD_MODULE])
    _go(["mod", "tidy"], module, work, "resolving modules")
    run_go_build([ETCD_MODULE], ["-ldflags", "-s -w", "-o", str(out / "etcd")], module, work, reporter,
              f"compiling etcd v{version}")


# --- KWOK -------------------------------------------------------------------------------------

def _build_kwok(version: str, work: Path, out: Path, reporter: Reporter) -> None:
    env = {"GOBIN": str(out)}
    run_go_build([f"{KWOK_PACKAGE}@v{version}"], [], work, work, reporter, f"compiling KWOK v{version}",
              verb="install", extra_env=env)


# --- helpers ----------------------------------------------------------------------------------

def _go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -mod=mod", "GO111MODULE": "on"})
    env.update(extra or {})
    return env


def _write_tools_file(module: Path, packages) -> None:
    # A tools file lists the commands as imports so `go mod tidy` records their dependencies; the build
    # tag keeps it out of every real build.
    imports = "\n".join(f'\t_ "{pkg}"' for pkg in packages)
    (module / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")


def download_module(spec: str, work: Path) -> dict:
    output = _go(["mod", "download", "-json", spec], work, work, f"downloading {spec}")
    try:
        info = json.loads(output)
    except ValueError:
        raise BinariesError(f"`go mod download {spec}` returned no module information",
                            log_file=work / "go.log") from None
    if info.get("Error"):
        raise BinariesError(f"cannot download {spec} from the Go module proxy: {info['Error']}",
                            hint="check GOPROXY and network access to the Go module proxy")
    return info


def _module_time(info: dict) -> str:
    try:
        return json.loads(Path(info["Info"]).read_text())["Time"][:19] + "Z"
    except (OSError, ValueError, KeyError):
        return "1970-01-01T00:00:00Z"


def _go(args: list[str], cwd: Path, work: Path, what: str, extra_env: dict | None = None) -> str:
    log = work / "go.log"
    with open(log, "a") as log_handle:
        log_handle.write(f"\n$ go {' '.join(args)}   (in {cwd})\n")
        log_handle.flush()
        proc = subprocess.run(["go", *args], cwd=cwd, env=_go_env(extra_env), stdout=subprocess.PIPE,
                              stderr=log_handle, text=True)
    if proc.returncode != 0:
        raise BinariesError(f"{what} failed (go {' '.join(args[:2])} exited {proc.returncode})",
                            log_file=log, hint=_tail(log))
    return proc.stdout


def run_go_build(packages: list[str], flags: list[str], cwd: Path, work: Path, reporter: Reporter, title: str,
              verb: str = "build", extra_env: dict | None = None) -> None:
    """Run `go build -v`, turning the package names it prints into a progress bar."""
    total = _count_packages(packages, cwd, extra_env) if verb == "build" else 400
    log = work / "go.log"
    cmd = ["go", verb, "-v", "-trimpath", *flags, *packages]
    with open(log, "a") as log_handle, reporter.counter(title, total) as counter:
        log_handle.write(f"\n$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=cwd, env=_go_env(extra_env), stdout=log_handle, stderr=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                log_handle.write(line)
                counter.advance()
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if code != 0:
        raise BinariesError(f"{title} failed (go {verb} exited {code})", log_file=log, hint=_tail(log))


def _count_packages(packages: list[str], cwd: Path, extra_env: dict | None) -> int:
    proc = subprocess.run(["go", "list", "-deps", *packages], cwd=cwd, env=_go_env(extra_env),
                          capture_output=True, text=True)
    return max(1, len(proc.stdout.split())) if proc.returncode == 0 else 1000


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "last lines of the build log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
