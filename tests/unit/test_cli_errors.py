"""The CLI on bad input: exit 1, one located `error:` line, no traceback, and nothing built or started.

Every case runs `python -m harness.cli` in a subprocess with the state and cache directories pointed
into a temporary directory, so nothing real is touched. The cases run concurrently (each takes about
half a second, mostly imports) so the file stays fast.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import paths

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    state_dir: Path
    cache_dir: Path

    def __str__(self) -> str:
        return f"dra-harness {' '.join(self.args)} -> {self.code}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


# (id, arguments, text that locates the problem in stderr)
BAD_INPUT = [
    ("bad-name", ["cluster", "up", "--name", "Bad_Name"], ["--name: Bad_Name", "not a valid cluster name"]),
    ("too-many-real-nodes", ["cluster", "up", "--real-nodes", "9"], ["--real-nodes: 9", "0 to 4"]),
    ("real-nodes-on-kind", ["cluster", "up", "--backend", "kind", "--real-nodes", "1"],
     ["--real-nodes: 1", "not used by --backend kind"]),
    ("bad-real-nodes-count", ["conformance", "run", "--real-nodes", "many"], ["real nodes 'many'", "not a number"]),
    ("bad-gate-value", ["cluster", "up", "--feature-gates", "Foo=maybe"], ["--feature-gates: Foo", "not a boolean"]),
    ("dependency", ["cluster", "up", "--feature-gates", "GenericWorkload=false"],
     ["DRAWorkloadResourceClaims", "needs GenericWorkload"]),
    ("bad-preset", ["cluster", "up", "--preset", "nope"], ["--preset: nope", "unknown preset", "all-dra"]),
    ("negative-nodes", ["cluster", "up", "--nodes", "-1"], ["--nodes: -1", "must be 0 or more"]),
    ("bad-version", ["cluster", "up", "--kubernetes-version", "1.99.0"],
     ["--kubernetes-version", "no feature-gate matrix for 1.99.0"]),
    # rich markup characters in user input must be printed, not interpreted
    ("markup-in-input", ["cluster", "up", "--runtime-config", "[/x]=true"],
     ["--runtime-config: [/x]", "not an API group/version"]),
    ("down-missing", ["cluster", "down", "--name", "nosuch"], ["no cluster named 'nosuch'", "cluster list"]),
    ("status-missing", ["cluster", "status", "--name", "nosuch"], ["no cluster named 'nosuch'", "cluster list"]),
    ("binaries-path-empty", ["binaries", "path"], ["not installed", "binaries install"]),
]
OK_INPUT = [("list-empty", ["cluster", "list"])]


def _run(args: list[str], root: Path) -> Result:
    state_dir, cache_dir = root / "state", root / "cache"
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env.update({paths.STATE_ENV: str(state_dir), paths.CACHE_ENV: str(cache_dir), "PYTHONPATH": str(REPO),
                "NO_COLOR": "1"})
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr, state_dir, cache_dir)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    cases = [(case_id, args) for case_id, args, _ in BAD_INPUT] + OK_INPUT
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:
        futures = {case_id: pool.submit(_run, args, tmp_path_factory.mktemp(case_id)) for case_id, args in cases}
        return {case_id: future.result() for case_id, future in futures.items()}


@pytest.mark.parametrize("case_id, args, located", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_fails_cleanly(results, case_id, args, located):
    result = results[case_id]
    assert result.code == 1, result
    assert "error:" in result.stderr, result
    for text in located:
        assert text in result.stderr, f"{text!r} missing\n{result}"
    assert "Traceback" not in result.stdout + result.stderr, result
    assert result.stdout == "", result  # errors go to stderr only
    # Rejected before any slow work: nothing was built, downloaded or started.
    assert not (result.cache_dir / "binaries").exists(), result
    clusters = result.state_dir / "clusters"
    assert not clusters.exists() or not any(clusters.iterdir()), result


def test_cluster_list_empty(results):
    result = results["list-empty"]
    assert result.code == 0, result
    assert "Traceback" not in result.stdout + result.stderr, result
    assert "error" not in result.stderr, result
    assert "name" in result.stdout  # the (empty) table's header
    assert not (result.cache_dir / "binaries").exists(), result
