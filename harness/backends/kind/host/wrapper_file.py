"""Writes the runc wrapper (runc_wrapper.py) out as an executable script with its settings."""

from __future__ import annotations

from pathlib import Path

from harness.core.files import write_atomic

SOURCE = Path(__file__).with_name("runc_wrapper.py")


def render(python: str, runc: str, drop: list[str] | tuple[str, ...], clamp_oom: bool) -> str:
    """The script: a shebang, the wrapper's source, its three settings and the call of main()."""
    settings = (f"\nRUNC = {runc!r}\nDROP = frozenset({sorted(drop)!r})\nCLAMP_OOM = {bool(clamp_oom)!r}\n\n"
                "if __name__ == '__main__':\n    sys.exit(main(sys.argv[1:], RUNC, DROP, CLAMP_OOM))\n")
    return f"#!{python}\n" + SOURCE.read_text() + settings


def write(path: Path, python: str, runc: str, drop: list[str] | tuple[str, ...], clamp_oom: bool) -> Path:
    return write_atomic(path, render(python, runc, drop, clamp_oom), mode=0o755)
