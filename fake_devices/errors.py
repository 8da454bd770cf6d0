"""Located input errors, shared by profile and driver-config validation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong in one input: where, what, and what would be accepted."""

    source: str  # file name, or "--flag" for command-line input
    field: str  # path inside the source, e.g. "spec.gpus[0].mig.partitions[2].start"
    problem: str
    allowed: str | None = None

    def __str__(self) -> str:
        text = f"{self.source}: {self.field}: {self.problem}"
        if self.allowed:
            text += f" (allowed: {self.allowed})"
        return text


class InvalidInput(Exception):
    """Bad user input, with every problem found so one run shows them all."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        if len(lines) == 1:
            message = "invalid input: " + lines[0]
        else:
            message = f"invalid input ({len(lines)} problems):\n" + "\n".join("  - " + line for line in lines)
        super().__init__(message)
        self.message = message
