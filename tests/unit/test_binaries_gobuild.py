"""Pure functions of harness.binaries.gobuild: wrapper go.mod generation, ldflags, Go detection."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.binaries import Versions, gobuild
from harness.core.errors import BinariesError
from harness.core.progress import Reporter

KUBERNETES_GOMOD = """\
// This is a generated file. Do not edit directly.

module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tgithub.com/blang/semver/v4 v4.0.0
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/kubelet v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/dynamic-resource-allocation => ./staging/src/k8s.io/dynamic-resource-allocation
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/not-staging => ../elsewhere/not-staging
\tgithub.com/example/thing => ./staging/src/github.com/example/thing
)

replace k8s.io/sample-controller => ./staging/src/k8s.io/sample-controller
"""

ETCD_GOMOD = """\
module go.etcd.io/etcd/server/v3

go 1.26.0

toolchain go1.26.8

require (
\tgo.etcd.io/etcd/api/v3 v3.6.16
\tgo.etcd.io/etcd/client/pkg/v3 v3.6.16
\tgo.etcd.io/bbolt v1.4.3
)

replace (
\tgo.etcd.io/etcd/api/v3 => ../api
\tgo.etcd.io/etcd/client/pkg/v3 => ../client/pkg
\tgo.etcd.io/etcd/client/v3 => ../client/v3
\tgo.etcd.io/etcd/pkg/v3 => ../pkg
)

// Bad imports are sometimes causing attempts to pull that code.
// This makes the error more explicit.
replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY

replace go.etcd.io/etcd/v3 => ./FORBIDDEN_DEPENDENCY

replace go.etcd.io/tests/v3 => ./FORBIDDEN_DEPENDENCY
"""

GO_MOD_CACHE = Path("/root/go/pkg/mod/cache/download")
REAL_KUBERNETES_MOD = GO_MOD_CACHE / "k8s.io/kubernetes/@v/v1.37.2.mod"
REAL_ETCD_MOD = GO_MOD_CACHE / "go.etcd.io/etcd/server/v3/@v/v3.6.16.mod"


def directives(gomod: str, keyword: str) -> list[str]:
    return [line for line in gomod.splitlines() if line.startswith(keyword + " ")]


# --- Kubernetes -------------------------------------------------------------------------------

def test_staging_replacements_from_block_and_single_line():
    assert gobuild.staging_replacements(KUBERNETES_GOMOD) == [
        "k8s.io/api",
        "k8s.io/client-go",
        "k8s.io/dynamic-resource-allocation",
        "k8s.io/kubelet",
        "k8s.io/sample-controller",
    ]  # sorted, de-duplicated; non-staging and non-k8s.io replaces ignored


def test_staging_replacements_none():
    assert gobuild.staging_replacements("module example.com/x\n\ngo 1.22\n") == []
    assert gobuild.staging_replacements("replace k8s.io/api => k8s.io/api v0.37.2\n") == []


def test_kubernetes_wrapper_gomod():
    wrapper = gobuild.kubernetes_wrapper_gomod("1.37.2", KUBERNETES_GOMOD)
    assert wrapper.endswith("\n")
    assert directives(wrapper, "module") == ["module dra-harness.local/kubernetes-build"]
    assert directives(wrapper, "go") == ["go 1.26.0"]
    assert directives(wrapper, "require") == ["require k8s.io/kubernetes v1.37.2"]
    assert "replace k8s.io/api => k8s.io/api v0.37.2" in wrapper.splitlines()
    assert directives(wrapper, "replace") == [
        "replace k8s.io/api => k8s.io/api v0.37.2",
        "replace k8s.io/client-go => k8s.io/client-go v0.37.2",
        "replace k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.37.2",
        "replace k8s.io/kubelet => k8s.io/kubelet v0.37.2",
        "replace k8s.io/sample-controller => k8s.io/sample-controller v0.37.2",
    ]
    assert "./staging" not in wrapper
    assert "staging" not in wrapper
    assert "not-staging" not in wrapper and "github.com" not in wrapper


def test_kubernetes_wrapper_gomod_other_version_and_default_go():
    text = "module k8s.io/kubernetes\n\nreplace k8s.io/api => ./staging/src/k8s.io/api\n"
    wrapper = gobuild.kubernetes_wrapper_gomod("1.35.10", text)
    assert directives(wrapper, "go") == ["go 1.22"]
    assert directives(wrapper, "require") == ["require k8s.io/kubernetes v1.35.10"]
    assert directives(wrapper, "replace") == ["replace k8s.io/api => k8s.io/api v0.35.10"]


def test_go_directive_not_confused_by_toolchain_or_godebug():
    assert gobuild.go_directive(ETCD_GOMOD) == "1.26.0"
    assert gobuild.go_directive("godebug default=go1.21\ngo 1.25.3\n") == "1.25.3"


def test_kubernetes_ldflags():
    flags = gobuild.kubernetes_ldflags("1.37.2", "2026-01-02T03:04:05Z")
    tokens = flags.split()
    assert tokens[:2] == ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        for setting in (f"{pkg}.gitVersion=v1.37.2", f"{pkg}.gitMajor=1", f"{pkg}.gitMinor=37",
                        f"{pkg}.gitTreeState=clean", f"{pkg}.buildDate=2026-01-02T03:04:05Z"):
            assert f"-X {setting}" in flags
    # every -X is followed by exactly one name=value
    x_values = [tokens[i + 1] for i, t in enumerate(tokens) if t == "-X"]
    assert len(x_values) == 10
    assert all(re.fullmatch(r"k8s\.io/[\w/.-]+\.\w+=\S+", v) for v in x_values)


@pytest.mark.skipif(not REAL_KUBERNETES_MOD.is_file(), reason=f"{REAL_KUBERNETES_MOD} is not in the Go module cache")
def test_staging_replacements_of_real_kubernetes_gomod():
    text = REAL_KUBERNETES_MOD.read_text()
    modules = gobuild.staging_replacements(text)
    for module in ("k8s.io/api", "k8s.io/client-go", "k8s.io/kubelet", "k8s.io/dynamic-resource-allocation"):
        assert module in modules
    assert modules == sorted(set(modules))
    wrapper = gobuild.kubernetes_wrapper_gomod("1.37.2", text)
    assert "./staging" not in wrapper
    assert directives(wrapper, "go") == [f"go {gobuild.go_directive(text)}"]


# --- etcd -------------------------------------------------------------------------------------

def test_etcd_wrapper_gomod():
    wrapper = gobuild.etcd_wrapper_gomod("3.6.16", ETCD_GOMOD)
    assert directives(wrapper, "module") == ["module dra-harness.local/etcd-build"]
    assert directives(wrapper, "go") == ["go 1.26.0"]
    assert directives(wrapper, "require") == ["require go.etcd.io/etcd/server/v3 v3.6.16"]
    assert directives(wrapper, "replace") == [
        "replace go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v3.6.16",
        "replace go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 v3.6.16",
        "replace go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 v3.6.16",
        "replace go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 v3.6.16",
    ]
    assert "FORBIDDEN_DEPENDENCY" not in wrapper
    assert "../" not in wrapper
    assert "tests/v3" not in wrapper


@pytest.mark.skipif(not REAL_ETCD_MOD.is_file(), reason=f"{REAL_ETCD_MOD} is not in the Go module cache")
def test_etcd_wrapper_of_real_gomod():
    wrapper = gobuild.etcd_wrapper_gomod("3.6.16", REAL_ETCD_MOD.read_text())
    assert "replace go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v3.6.16" in wrapper.splitlines()
    assert "FORBIDDEN_DEPENDENCY" not in wrapper
    assert "../" not in wrapper


# --- Go detection -----------------------------------------------------------------------------

def test_require_go_without_go(monkeypatch):
    monkeypatch.setattr(gobuild.shutil, "which", lambda *args, **kwargs: None)
    assert gobuild.go_version() is None
    assert not gobuild.go_available()
    with pytest.raises(BinariesError) as caught:
        gobuild.require_go()
    assert "not on PATH" in caught.value.message
    hint = caught.value.hint or ""
    assert "--binaries-dir" in hint and "--source download" in hint


def fake_go(monkeypatch, stdout: str):
    monkeypatch.setattr(gobuild.shutil, "which", lambda *args, **kwargs: "/fake/bin/go")
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(gobuild.subprocess, "run", run)
    return calls


def test_go_version_parsed(monkeypatch):
    calls = fake_go(monkeypatch, "go1.26.8\n")
    assert gobuild.go_version() == (1, 26)
    assert calls == [["/fake/bin/go", "env", "GOVERSION"]]
    assert gobuild.go_available()
    gobuild.require_go()  # no error


def test_go_too_old(monkeypatch):
    fake_go(monkeypatch, "go1.21.13\n")
    assert gobuild.go_version() == (1, 21)
    assert not gobuild.go_available()
    with pytest.raises(BinariesError) as caught:
        gobuild.require_go()
    assert "1.21" in caught.value.message
    assert "1.22" in (caught.value.hint or "")


def test_go_version_unparseable(monkeypatch):
    fake_go(monkeypatch, "devel\n")
    assert gobuild.go_version() is None
    assert not gobuild.go_available()


def test_go_version_when_go_cannot_run(monkeypatch):
    monkeypatch.setattr(gobuild.shutil, "which", lambda *args, **kwargs: "/fake/bin/go")

    def run(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, 60)

    monkeypatch.setattr(gobuild.subprocess, "run", run)
    assert gobuild.go_version() is None


# --- small helpers ----------------------------------------------------------------------------

def test_go_env_overrides(monkeypatch):
    monkeypatch.setenv("CGO_ENABLED", "1")
    monkeypatch.setenv("DRA_TEST_MARKER", "kept")
    env = gobuild._go_env({"GOBIN": "/out"})
    assert env["CGO_ENABLED"] == "0"
    assert env["GO111MODULE"] == "on"
    assert "-mod=mod" in env["GOFLAGS"].split()
    assert env["GOBIN"] == "/out"
    assert env["DRA_TEST_MARKER"] == "kept"


def test_write_tools_file(tmp_path):
    gobuild._write_tools_file(tmp_path, ["k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kubectl"])
    text = (tmp_path / "tools.go").read_text()
    assert text.startswith("//go:build tools\n")
    assert "package tools" in text
    assert '\t_ "k8s.io/kubernetes/cmd/kubelet"\n' in text
    assert '\t_ "k8s.io/kubernetes/cmd/kubectl"\n' in text


def test_kube_packages_cover_the_group():
    assert set(gobuild.KUBE_PACKAGES) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                          "kubelet", "kubectl"}
    assert gobuild.KUBE_PACKAGES["kubelet"] == "k8s.io/kubernetes/cmd/kubelet"


def test_module_time(tmp_path):
    info = tmp_path / "v1.37.2.info"
    info.write_text(json.dumps({"Version": "v1.37.2", "Time": "2026-05-14T17:30:12.123Z"}))
    assert gobuild._module_time({"Info": str(info)}) == "2026-05-14T17:30:12Z"
    assert gobuild._module_time({"Info": str(tmp_path / "missing")}) == "1970-01-01T00:00:00Z"
    assert gobuild._module_time({}) == "1970-01-01T00:00:00Z"


def test_tail(tmp_path):
    log = tmp_path / "go.log"
    log.write_text("\n".join(f"line {i}" for i in range(40)) + "\n")
    tail = gobuild._tail(log, lines=3)
    assert tail.splitlines()[1:] == ["line 37", "line 38", "line 39"]
    assert gobuild._tail(tmp_path / "missing") == ""


def test_provide_unknown_group_cleans_up(tmp_path, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild, "require_go", lambda: None)

    class Odd(Versions):
        def of_group(self, group):
            return "1.0.0"

    with pytest.raises(BinariesError, match="unknown binary group"):
        gobuild.provide("containerd", Odd(), tmp_path / "target", Reporter(quiet=True))
    work = tmp_path / "cache" / "build" / "containerd-v1.0.0"
    assert work.is_dir()
    assert list(work.iterdir()) == []  # the temporary out- directory was removed


def test_provide_requires_go(tmp_path, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild.shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(BinariesError, match="not on PATH"):
        gobuild.provide("kubernetes", Versions(), tmp_path / "target", Reporter(quiet=True))
    assert not (tmp_path / "cache").exists()
