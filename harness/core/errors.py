"""Errors a user can act on.

Everything the harness raises for a user mistake or an environment problem is a HarnessError; the
CLI prints it as one short message (no traceback unless -v). Anything else is a bug in the harness.
"""

from __future__ import annotations

from pathlib import Path

# Problem lives in fake_devices (which ships alone and must not import harness); both share it.
from fake_devices.errors import InvalidInput, Problem

__all__ = ["HarnessError", "ConfigError", "ComponentError", "BinariesError", "ClusterNotFound", "InvalidInput",
           "Problem"]


class HarnessError(Exception):
    """A failure with a message meant for the user."""

    def __init__(self, message: str, *, hint: str | None = None, log_file: Path | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.log_file = log_file

    def __str__(self) -> str:
        parts = [self.message]
        if self.log_file is not None:
            parts.append(f"log: {self.log_file}")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class ConfigError(HarnessError):
    """Bad user input. Carries every problem found, so one run shows them all."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__(InvalidInput(self.problems).message)


class ComponentError(HarnessError):
    """A cluster component failed to start or died; names the component and its log."""

    def __init__(self, component: str, message: str, *, log_file: Path | None = None,
                 log_tail: str | None = None, hint: str | None = None):
        text = f"{component}: {message}"
        if log_tail:
            text += "\n--- last lines of its log ---\n" + log_tail.rstrip()
        super().__init__(text, hint=hint, log_file=log_file)
        self.component = component


class ComponentDied(ComponentError):
    """A component of the cluster under test is not running any more (a backend's component watch says so)."""


class BinariesError(HarnessError):
    """Binaries are missing, cannot be built or failed verification."""


class ClusterNotFound(HarnessError):
    """No cluster of that name exists."""
