"""The allowed import directions (pyproject.toml [tool.importlinter], run by `make lint`) hold for the
tree, and a contract really fails when it is broken: here the suite importing a backend."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.is_file(), reason="import-linter is not installed (pip install -e '.[dev]')")


def _lint_imports(root: Path = REPO) -> subprocess.CompletedProcess:
    """lint-imports with the project's contracts; packages are looked up in `root` (its working
    directory) first, then where the project is installed."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_tree_keeps_its_contracts():
    result = _lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_suite_module_importing_a_backend_breaks_a_contract(tmp_path):
    # a copy of the suite, found first on the path, with one module that reaches into the local backend
    shutil.copytree(REPO / "conformance", tmp_path / "conformance", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "conformance" / "reaches_in.py").write_text("from harness.backends.local import state\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "conformance is not allowed to import harness.backends" in result.stdout
    assert "conformance.reaches_in -> harness.backends.local.state" in result.stdout


def test_a_core_module_importing_a_job_breaks_the_layers(tmp_path):
    # a copy of harness/, found first on the path, whose bottom layer reaches up to a job
    shutil.copytree(REPO / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "harness" / "core" / "reaches_up.py").write_text("from harness.jobs import report\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "harness.core.reaches_up -> harness.jobs.report" in result.stdout


def test_a_new_package_of_harness_must_be_placed_in_the_layers(tmp_path):
    shutil.copytree(REPO / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "harness" / "misc.py").write_text('"""Somewhere."""\n')
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "harness.misc" in result.stdout and "exhaustive" in result.stdout


def _cycles(graph) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_around_a_loop():
    """Imports inside functions count too: a cycle is broken by moving the shared piece down."""
    grimp = pytest.importorskip("grimp")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))  # the walk goes as deep as the longest import chain
    try:
        graph = grimp.build_graph("harness", "fake_devices", "conformance", "load")
        assert _cycles(graph) == []
        # and the check finds one when there is one
        graph.add_import(importer="harness.core.errors", imported="harness.cli.main")
        assert any("harness.core.errors" in group for group in _cycles(graph))
    finally:
        sys.setrecursionlimit(limit)
