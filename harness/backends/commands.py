"""External commands as data, and one way to run them.

The kind and existing backends do their work with `docker`, `kind` and `kubectl`. Each backend first
builds the whole sequence as a list of `Step`s (pure data: argv, pipes, output files, or a named
Python action such as waiting for ResourceSlices), then runs it. Tests compare the list itself, so
the exact commands `cluster up` would run are checked without Docker.

The local backend's real nodes ask the machine short questions and make small changes (`ip`,
`iptables`, `ctr`, `umount`, `go build`) whose exit status they judge themselves: `Runner.query`
and `Runner.which`. Every such command goes through a Runner, so a test hands in one built from a
fake `run` and `which` and sees exactly the commands that would run.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.core.errors import HarnessError
from harness.core.progress import Reporter

OUTPUT_TAIL = 25  # lines of a failed command's output shown in the error


@dataclass(frozen=True)
class Step:
    """One thing `up`/`down` does: a command (optionally fed by a producer through a pipe, optionally
    writing its stdout to a file) or a named Python action of the backend."""

    title: str
    argv: tuple[str, ...] = ()
    pipe_from: tuple[str, ...] = ()  # `pipe_from | argv`
    stdout_file: Path | None = None  # `argv > stdout_file`
    action: str | None = None  # a backend action instead of a command (see Runner.actions)
    expect_lines: frozenset[str] | None = None  # the command's output lines must be exactly these
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if bool(self.argv) == bool(self.action):
            raise ValueError(f"step {self.title!r}: give either argv or action")

    def __str__(self) -> str:
        if self.action:
            return f"[{self.action}] {self.title}"
        text = shlex.join(self.argv)
        if self.pipe_from:
            text = shlex.join(self.pipe_from) + " | " + text
        if self.stdout_file is not None:
            text += f" > {shlex.quote(str(self.stdout_file))}"
        return text


def command(title: str, *argv: str | Path, **options) -> Step:
    return Step(title, tuple(str(a) for a in argv), **options)


def action(name: str, title: str) -> Step:
    return Step(title, action=name)


class CommandFailed(HarnessError):
    pass


class Runner:
    """Runs steps in order with progress output; `actions` maps action names to callables."""

    def __init__(self, reporter: Reporter | None = None, actions: dict[str, Callable[[], object]] | None = None,
                 popen: Callable = subprocess.Popen, env: dict[str, str] | None = None, *,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                 which: Callable[[str], str | None] = shutil.which):
        self.reporter = reporter or Reporter(quiet=True)
        self.actions = dict(actions or {})
        self._popen = popen
        self._env = env  # the commands' environment (e.g. DOCKER_HOST of the harness's own dockerd)
        self._run = run
        self._which = which

    def query(self, argv: Sequence[str | Path], *, timeout: float = 60.0, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        """A short command whose exit status the caller judges: text output captured, never raises for
        an exit status. A missing program or a timeout come back as 127 / 124 with the reason in stderr.
        `env` replaces the environment (default: the runner's, else this process's)."""
        args = [str(a) for a in argv]
        options: dict = {"capture_output": True, "text": True, "timeout": timeout}
        if cwd is not None:
            options["cwd"] = cwd
        if env is not None or self._env is not None:
            options["env"] = dict(env if env is not None else self._env or {})
        try:
            return self._run(args, **options)
        except FileNotFoundError:
            return subprocess.CompletedProcess(args, 127, "", f"{args[0]}: not installed")
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(args, 124, "", f"no answer within {timeout:.0f}s")

    def which(self, program: str) -> str | None:
        """Where `program` is on PATH (None: not installed)."""
        return self._which(program)

    def run_all(self, steps: Iterable[Step]) -> None:
        for step in steps:
            self.run(step)

    def run(self, step: Step) -> str:
        with self.reporter.step(step.title):
            if step.action:
                try:
                    handler = self.actions[step.action]
                except KeyError:
                    raise HarnessError(f"internal error: no handler for action {step.action!r}") from None
                handler()
                return ""
            return self._command(step)

    def _env_option(self) -> dict:
        return {"env": self._env} if self._env is not None else {}  # fake popens in tests take no env

    def _command(self, step: Step) -> str:
        out_file = open(step.stdout_file, "wb") if step.stdout_file is not None else None  # noqa: SIM115
        producer = proc = None
        captured: dict[str, bytes] = {}
        try:
            try:
                if step.pipe_from:
                    producer = self._popen(list(step.pipe_from), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           **self._env_option())
                proc = self._popen(list(step.argv), stdin=producer.stdout if producer else subprocess.DEVNULL,
                                   stdout=out_file or subprocess.PIPE, stderr=subprocess.PIPE, **self._env_option())
            except FileNotFoundError as err:
                raise CommandFailed(f"{step.title}: cannot run {err.filename}: not installed") from None
            if producer is not None:
                producer.stdout.close()  # the consumer owns the pipe now; the producer sees EPIPE if it stops
            # Read both processes' stderr (and stdout) on threads, so neither blocks on a full pipe.
            readers = [_drain(proc.stderr, captured, "stderr")]
            if out_file is None:
                readers.append(_drain(proc.stdout, captured, "stdout"))
            if producer is not None:
                readers.append(_drain(producer.stderr, captured, "producer"))
            deadline = time.monotonic() + step.timeout
            code = _wait(proc, deadline)
            producer_code = _wait(producer, deadline) if producer is not None else 0
            if code is None or producer_code is None:
                _kill(producer, proc)  # so the readers see the end of their pipes
            for reader in readers:
                reader.join(timeout=10)
        finally:
            if out_file is not None:
                out_file.close()
            _kill(producer, proc)
        if code is None or producer_code is None:
            raise CommandFailed(f"{step.title}: `{step}` did not finish within {step.timeout:.0f}s")
        if producer_code != 0:
            raise CommandFailed(f"{step.title}: `{shlex.join(step.pipe_from)}` exited with {producer_code}"
                                + _tail(captured.get("producer", b"")))
        if code != 0:
            raise CommandFailed(f"{step.title}: `{shlex.join(step.argv)}` exited with {code}"
                                + _tail(captured.get("stderr", b"") or captured.get("stdout", b"")))
        stdout = captured.get("stdout", b"").decode(errors="replace")
        if step.expect_lines is not None:
            got = frozenset(line.strip() for line in stdout.splitlines() if line.strip())
            if got != step.expect_lines:
                raise CommandFailed(f"{step.title}: `{step}` printed {sorted(got)}, expected {sorted(step.expect_lines)}")
        return stdout


def _kill(*processes) -> None:
    """Kill each process still running and everything it started: `kind create cluster` runs `docker
    run`s of its own, which would go on creating containers after the clean-up."""
    for process in processes:
        if process is None or process.poll() is not None:
            continue
        descendants = []
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(process.pid)
            parent.suspend()  # it starts nothing new while its children are collected
            descendants = parent.children(recursive=True)
        process.kill()
        process.wait()
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(descendants, timeout=10)


def _drain(stream, captured: dict[str, bytes], key: str) -> threading.Thread:
    def read() -> None:
        captured[key] = stream.read() if stream is not None else b""

    thread = threading.Thread(target=read, name=f"drain-{key}", daemon=True)
    thread.start()
    return thread


def _wait(process, deadline: float) -> int | None:
    try:
        return process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def _tail(output: bytes) -> str:
    lines = output.decode(errors="replace").rstrip().splitlines()[-OUTPUT_TAIL:]
    return ("\n--- last lines of its output ---\n" + "\n".join(lines)) if lines else ""


def run_quiet(argv: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A short query (`docker info`, `kind version`): output captured, never raises for exit codes.
    A missing program or a timeout comes back as returncode 127 / 124 with the reason in stderr."""
    return Runner(env=env).query(argv, timeout=timeout)
