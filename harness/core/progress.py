"""Progress output for long work (builds, cluster start, scale-up), on stderr so stdout stays data.

On a terminal rich draws spinners and bars; in CI logs the same calls print one line per step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class Reporter:
    def __init__(self, *, quiet: bool = False, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)

    def info(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        """Run one named step: a spinner while it runs, then ✓ or ✗ with its duration."""
        start = time.monotonic()
        status = None
        if not self.quiet and self.console.is_terminal:
            status = self.console.status(title)
            status.start()
        elif not self.quiet:
            self.console.print(f"… {title}")  # in a CI log, say what is running before it takes minutes
        try:
            yield
        except BaseException:
            if status:
                status.stop()
            if not self.quiet:
                self.console.print(f"[red]✗[/red] {title} ({time.monotonic() - start:.1f}s)")
            raise
        if status:
            status.stop()
        if not self.quiet:
            self.console.print(f"[green]✓[/green] {title} ({time.monotonic() - start:.1f}s)")

    @contextlib.contextmanager
    def counter(self, title: str, total: int) -> Iterator["Counter"]:
        """A bar for countable work (packages compiled, nodes ready)."""
        if self.quiet or not self.console.is_terminal:
            counter = Counter(None, None, title, total, self if not self.quiet else None)
            with self.step(f"{title} ({total})") if not self.quiet else contextlib.nullcontext():
                yield counter
            return
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(title, total=total)
            with self.step(f"{title} ({total})"):
                yield Counter(bar, task, title, total, None)


class Counter:
    def __init__(self, bar, task, title: str, total: int, log_reporter: Reporter | None):
        self._bar, self._task, self.title, self.total = bar, task, title, total
        self._done = 0
        self._log = log_reporter
        self._last_logged = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self._done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=min(self._done, self.total))
        elif self._log is not None and time.monotonic() - self._last_logged >= 15:
            # In a CI log, a line every 15 s shows the work is alive without flooding it.
            self._last_logged = time.monotonic()
            self._log.info(f"  {self.title}: {min(self._done, self.total)}/{self.total}")
