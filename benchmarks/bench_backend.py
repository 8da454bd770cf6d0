"""`--backend` of the benchmark scripts: which backends each benchmark accepts, and its cluster through
the backend registry (`harness.backends.get`), never by constructing a backend class.

A benchmark that only makes sense on a cluster this machine runs (it reads the control plane's
processes, creates KWOK nodes, starts a real node or switches feature gates) accepts only `local` and
refuses another backend with exit status 2, naming the flag, why, and what is allowed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from harness import backends
from harness.backends.base import Backend, ClusterInfo, ClusterSpec
from harness.core.errors import ConfigError, Problem
from harness.core.progress import Reporter

DEFAULT = "local"


def add_flags(parser: argparse.ArgumentParser, allowed: Sequence[str], *, kubeconfig: bool = False) -> None:
    """`--backend` (and, where `existing` is allowed, `--kubeconfig`, which alone means `existing`)."""
    parser.add_argument("--backend", default=None,
                        help=f"cluster backend: {', '.join(allowed)} (default: "
                             f"{'existing with --kubeconfig, else ' if kubeconfig else ''}{DEFAULT})")
    if kubeconfig:
        parser.add_argument("--kubeconfig", default=None, help="existing: the cluster to use (default: $KUBECONFIG)")


def problems(args: argparse.Namespace, allowed: Sequence[str], why: str) -> list[Problem]:
    """What is wrong with the backend flags of `args` for a benchmark that accepts `allowed` (pure)."""
    kubeconfig = getattr(args, "kubeconfig", None)
    name = args.backend or ("existing" if kubeconfig and "existing" in allowed else DEFAULT)
    if name not in backends.BACKENDS:
        return [Problem("--backend", name, "unknown backend", ", ".join(allowed))]
    if name not in allowed:
        return [Problem("--backend", name, why, ", ".join(allowed))]
    if kubeconfig and name != "existing":
        return [Problem("--kubeconfig", kubeconfig, f"names a cluster to use, but --backend {name} starts its own",
                        "--kubeconfig with --backend existing, or leave it out")]
    return []


def resolve(parser: argparse.ArgumentParser, args: argparse.Namespace, allowed: Sequence[str],
            why: str) -> argparse.Namespace:
    """`args` with `args.backend` set to the chosen name; exit 2 with a located message otherwise."""
    found = problems(args, allowed, why)
    if found:
        parser.exit(2, "".join(f"error: {p}\n" for p in found))
    args.backend = args.backend or ("existing" if getattr(args, "kubeconfig", None) else DEFAULT)
    return args


def start(name: str, spec: ClusterSpec, reporter: Reporter | None = None) -> tuple[Backend, ClusterInfo]:
    """The cluster of `spec` from backend `name` (existing: attached to, nothing deployed). A bad
    flag value found by the backend (an unusable kubeconfig, say) exits 2 with its message."""
    backend = backends.get(name, reporter or Reporter(quiet=True))
    try:
        return backend, backend.up(spec)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
