"""Start the fake driver's kubelet plugins as forks of a Python that has already imported them.

Most of a plugin's start is Python importing the kubernetes client and grpc: about 1.3 s of CPU in each new
process. A suite run on the local backend starts some 60 plugins, and they were its largest consumer of CPU
(126 CPU-s of about 330 on 4 workers, more than the kube-apiserver; BENCHMARKS.md, "Suite time"). Here each
harness process keeps one small server (`python -m harness.backends.local.realnode.forked`) that imports the
plugin once and forks a plugin per request, so a start costs a fork.

multiprocessing's forkserver would do the forking, but it also runs the caller's `__main__` again in every
child (its "safe importing of main" preparation): a script or CLI that starts a plugin would run twice.

A forked plugin is what `process.start` would have made: its own session, the cluster directory as working
directory, stdin from /dev/null, its output appended to `logs/<name>.log`, its pid file, and a command line
that says what it is (setproctitle: `ps` shows it, and `cluster down`'s sweep finds it by the cluster
directory in its arguments). It is the server's child, not this process's: the server has the kernel reap it
(SIGCHLD ignored), and the harness follows it by pid and start time, as it follows any recorded process. The
server ends when the harness process does (its stdin closes); the plugins, in their own sessions, go on until
they are stopped. Should the server be gone, a plugin starts as a plain process instead.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from harness.backends.local import process

PLUGIN_MODULE = "fake_devices.kubeletplugin"
ANSWER_TIMEOUT = 60.0  # the server's first answer waits for its import: 1.5 s idle, far more on a loaded machine
_lock = threading.Lock()
_server: subprocess.Popen | None = None


def start(name: str, argv: list[str], cluster_dir: Path) -> process.Running:
    """Start `argv` (`python -m fake_devices.kubeletplugin ...`) forked from the server; its pid recorded."""
    assert argv[1:3] == ["-m", PLUGIN_MODULE], f"not a kubelet plugin's argv: {argv}"
    (cluster_dir / "logs").mkdir(parents=True, exist_ok=True)
    (cluster_dir / "pids").mkdir(parents=True, exist_ok=True)
    log = cluster_dir / "logs" / f"{name}.log"
    log.touch()  # there at once for a caller that reads it: the fork opens it when it gets to run
    request = {"args": argv[3:], "title": " ".join(argv), "log": str(log), "cwd": str(cluster_dir)}
    pid = _fork(request)
    if pid is None:
        return process.start(name, argv, cluster_dir)
    return process.record(name, pid, argv, cluster_dir)


def _fork(request: dict) -> int | None:
    """The pid of the plugin the server forked, or None when there is no working server."""
    global _server
    with _lock:
        for _ in range(2):  # a server that died (killed, its session hung up) is started again once
            if _server is None or _server.poll() is not None:
                _server = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                           start_new_session=True)  # a terminal's Ctrl-C is for the harness
            try:
                assert _server.stdin is not None and _server.stdout is not None
                _server.stdin.write(json.dumps(request) + "\n")
                _server.stdin.flush()
                # bounded: a server that does not answer is replaced (each answer is read whole, so nothing
                # waits in the pipe's buffer that select would miss)
                answered, _, _ = select.select([_server.stdout], [], [], ANSWER_TIMEOUT)
                answer = _server.stdout.readline() if answered else ""
            except (BrokenPipeError, OSError):
                answer = ""
            if answer:
                return int(json.loads(answer)["pid"])
            _server.kill()
            _server.wait()
    return None


def _serve() -> None:
    """The server: import the plugin, then fork one per request line on stdin; answer each with its pid."""
    from fake_devices.kubeletplugin import __main__ as plugin  # the 1.3 s, once

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the plugins: no zombies
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for line in sys.stdin:  # until the harness process ends
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_plugin(request)
            try:
                code = plugin.main(request["args"])
            except SystemExit as end:
                code = end.code if isinstance(end.code, int) else 1
            except BaseException:  # noqa: BLE001  (the plugin's own traceback, in its log, and out)
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code or 0)
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()


def _become_plugin(request: dict) -> None:
    """In the fork: what `process.start` makes of a component (session, directory, stdio, command line)."""
    import setproctitle

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    os.chdir(request["cwd"])
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the new fd 0, for the process's whole life)
    setproctitle.setproctitle(request["title"])
    sys.argv = request["title"].split(" ")


if __name__ == "__main__":
    _serve()
