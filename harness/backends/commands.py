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
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from harness.core.errors import HarnessError
from harness.core.progress import Reporter

OUTPUT_TAIL = 25  # lines of a failed command's output shown in the error
TOGETHER_MAX = 4  # commands of one `together` step running at once (a 2-core machine gains little past that)


@dataclass(frozen=True)
class Step:
    """One thing `up`/`down` does: a command (optionally fed by a producer through a pipe, optionally
    writing its stdout to a file) or a named Python action of the backend."""

    title: str
    argv: tuple[str, ...] = ()
    pipe_from: tuple[str, ...] = ()  # `pipe_from | argv`
    stdout_file: Path | None = None  # `argv > stdout_file`
    stdin_file: Path | None = None  # `argv < stdin_file`
    action: str | None = None  # a backend action instead of a command (see Runner.actions)
    # commands run at the same time (at most TOGETHER_MAX at once), each with its own deadline
    together: tuple[Step, ...] = ()
    expect_lines: frozenset[str] | None = None  # the command's output lines must be exactly these
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if sum(map(bool, (self.argv, self.action, self.together))) != 1:
            raise ValueError(f"step {self.title!r}: give one of argv, action or together")
        if any(s.action or s.together or s.pipe_from or s.stdout_file for s in self.together):
            raise ValueError(f"step {self.title!r}: together takes plain commands (argv, stdin_file) only")

    def __str__(self) -> str:
        if self.action:
            return f"[{self.action}] {self.title}"
        if self.together:
            return " & ".join(str(s) for s in self.together)
        text = shlex.join(self.argv)
        if self.pipe_from:
            text = shlex.join(self.pipe_from) + " | " + text
        if self.stdout_file is not None:
            text += f" > {shlex.quote(str(self.stdout_file))}"
        if self.stdin_file is not None:
            text += f" < {shlex.quote(str(self.stdin_file))}"
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
            if step.together:
                self._together(step)
                return ""
            return self._command(step)

    def _together(self, step: Step) -> None:
        """Run the step's commands at the same time, at most TOGETHER_MAX at once; every one that fails
        is named. Interrupted (Ctrl-C), the running ones are killed with their children."""
        pending, failures = list(step.together), []
        running: list[_Started] = []
        try:
            while pending or running:
                while pending and len(running) < TOGETHER_MAX:
                    try:
                        running.append(_Started.of(pending.pop(0), self._popen, self._env_option()))
                    except CommandFailed as err:  # could not start: named with the others
                        failures.append(str(err))
                for started in list(running):
                    code = started.poll()
                    if code is None:
                        continue
                    running.remove(started)
                    if code != 0:
                        failures.append(started.failure(code))
                if running:
                    _wait(running[0].proc, min(time.monotonic() + 0.2, running[0].deadline))
        except BaseException:
            for started in running:
                _kill(started.proc)
            raise
        finally:
            for started in running:
                started.close()
        if failures:
            raise CommandFailed(f"{step.title}: " + "\n".join(failures))

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


@dataclass
class _Started:
    """One command of a `together` step, running: its output goes to a temporary file (read on failure)."""

    step: Step
    proc: subprocess.Popen
    stdin: IO[bytes] | None  # None: /dev/null
    output: IO[bytes]
    deadline: float
    text: bytes = b""
    timed_out: bool = False

    @classmethod
    def of(cls, step: Step, popen: Callable, env_option: dict) -> _Started:
        stdin = open(step.stdin_file, "rb") if step.stdin_file is not None else None  # noqa: SIM115
        output = tempfile.TemporaryFile()  # noqa: SIM115  (closed by close())
        try:
            proc = popen(list(step.argv), stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=output,
                         stderr=subprocess.STDOUT, **env_option)
        except FileNotFoundError as err:
            for handle in (stdin, output):
                if handle is not None:
                    handle.close()
            raise CommandFailed(f"{step.title}: cannot run {err.filename}: not installed") from None
        return cls(step, proc, stdin, output, time.monotonic() + step.timeout)

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None and time.monotonic() >= self.deadline:
            _kill(self.proc)
            self.timed_out, code = True, self.proc.returncode
        if code is not None:
            self.output.seek(0)
            self.text = self.output.read()
            self.close()
        return code

    def failure(self, code: int) -> str:
        if self.timed_out:
            return f"{self.step.title}: `{self.step}` did not finish within {self.step.timeout:.0f}s"
        return f"{self.step.title}: `{self.step}` exited with {code}" + _tail(self.text)

    def close(self) -> None:
        for handle in (self.stdin, self.output):
            if handle is not None and not handle.closed:
                handle.close()


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
