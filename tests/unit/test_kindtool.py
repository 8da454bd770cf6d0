"""kind built into the cache (binaries.kindtool) and how the kind backend finds it: PATH first, then
the cached build, built only when an engine is possible and Go is there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.backends.kind import backend as kind
from harness.backends.kind import preflight as kind_preflight
from harness.binaries import gobuild, gotool, kindtool, manifest
from harness.core import paths
from harness.core.errors import BinariesError


def test_the_cached_kind_is_the_version_the_backend_requires():
    assert tuple(int(p) for p in kindtool.VERSION.split(".")) == kind_preflight.KIND_MIN_VERSION


def _fake_go_install(calls: list):
    """`go install sigs.k8s.io/kind@v...` writing a kind script into GOBIN."""
    def run_go_build(packages, flags, cwd, work, reporter, title, verb="build", extra_env=None):
        calls.append((packages, verb))
        (Path(extra_env["GOBIN"]) / "kind").write_text("#!/bin/sh\necho kind v0.33.0\n")
    return run_go_build


def test_ensure_builds_once_then_verifies(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild, "require_go", lambda: None)
    calls: list = []
    monkeypatch.setattr(gobuild, "run_go_build", _fake_go_install(calls))
    assert kindtool.locate() is None
    built = kindtool.ensure()
    assert calls == [(["sigs.k8s.io/kind@v0.33.0"], "install")]
    assert built == kindtool.cache_dir() / "kind" and kindtool.locate() == built
    assert kindtool.ensure() == built and len(calls) == 1  # cached: nothing built again
    built.write_text("#!/bin/sh\necho tampered\n")  # fails verification: built again
    assert kindtool.locate() is None
    kindtool.ensure()
    assert len(calls) == 2 and manifest.group_ok(kindtool.cache_dir(), manifest.load(kindtool.cache_dir()), "kind",
                                                  kindtool.VERSION)
    assert not list((tmp_path / "cache" / "build" / "kind-v0.33.0").glob("out-*"))  # the GOBIN is gone


def test_kind_on_path_wins_over_the_cached_one(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/local/bin/{name}")
    monkeypatch.setattr(kindtool, "locate", lambda: Path("/cache/kind"))
    assert kind_preflight.which_with_cached_kind("kind") == "/usr/local/bin/kind"


def test_the_cached_kind_is_used_when_none_is_on_path(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(kindtool, "locate", lambda: Path("/cache/kind"))
    assert kind_preflight.which_with_cached_kind("kind") == "/cache/kind"
    assert kind_preflight.which_with_cached_kind("docker") is None  # only kind has a cached build
    monkeypatch.setattr(kindtool, "locate", lambda: None)
    assert kind_preflight.which_with_cached_kind("kind") is None


@pytest.mark.parametrize("on_path, cached, go, builds", [
    (True, False, True, False),   # the machine's own kind
    (False, True, True, False),   # built before
    (False, False, False, False),  # no Go: preflight says kind is missing and how to get it
    (False, False, True, True),
])
def test_the_backend_builds_kind_only_when_it_is_nowhere_and_go_is_there(monkeypatch, on_path, cached, go, builds):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/kind" if on_path else None)
    monkeypatch.setattr(kindtool, "locate", lambda: Path("/cache/kind") if cached else None)
    monkeypatch.setattr(gobuild, "go_available", lambda: go)
    built: list = []
    monkeypatch.setattr(kindtool, "ensure", lambda reporter=None: built.append(1) or Path("/cache/kind"))
    assert kind.KindBackend()._kind_provided() is kind_preflight.which_with_cached_kind
    assert bool(built) == builds


def test_a_build_that_does_not_verify_is_an_error_naming_the_directory(tmp_path, monkeypatch):
    """binaries.gotool, shared by kind and dra-example-driver: a build whose result fails the manifest's
    check (here: the build wrote nothing usable) is refused, not returned."""
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild, "require_go", lambda: None)
    monkeypatch.setattr(gotool.manifest, "group_ok", lambda *args: False)
    tool = gotool.CachedGoBinary("demo", "1.0.0", "demo", 1 << 20,
                                 build=lambda work, output, reporter: output.write_text("#!/bin/sh\n"))
    with pytest.raises(BinariesError, match=r"demo v1.0.0 was built but fails verification in .*demo-v1.0.0_"):
        tool.ensure()
