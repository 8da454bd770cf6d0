"""What the kind backend needs from the machine, without Docker: every detection branch (fake /proc
text, fake `which` and command runner), the decision they lead to, dockerd's command line, the host
settings record, the docker.io install guard, and the runc wrapper run for real on sample OCI files
with a fake runc that records its argv."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness.backends.kind.host import capabilities, docker, dockerd, dockerinstall, enginechoice, hostnet, wrapper_file
from harness.core.errors import HarnessError

FULL = "000001ffffffffff"  # 41 capabilities (cap_last_cap 40), all there
NO_SYS_RESOURCE = "000001fffeffffff"  # measured on this VM: bit 24 missing


def _status(capbnd: str) -> str:
    return f"Name:\tpython\nCapInh:\t0000000000000000\nCapPrm:\t{capbnd}\nCapEff:\t{capbnd}\nCapBnd:\t{capbnd}\n"


# --- capabilities ---------------------------------------------------------------------------------


def test_missing_capabilities_are_the_kernels_minus_the_bounding_set():
    assert capabilities.missing(_status(FULL), 40) == []
    assert capabilities.missing(_status(NO_SYS_RESOURCE), 40) == ["CAP_SYS_RESOURCE"]
    assert capabilities.missing(_status("0000000000000000"), 2) == ["CAP_CHOWN", "CAP_DAC_OVERRIDE",
                                                                    "CAP_DAC_READ_SEARCH"]
    # A kernel newer than the name table: the bit is still reported.
    assert capabilities.missing(_status(FULL), 41) == ["CAP_41"]
    assert capabilities.NAMES[24] == "CAP_SYS_RESOURCE" and len(capabilities.NAMES) == 41
    with pytest.raises(ValueError, match="no CapBnd"):
        capabilities.bounding_mask("Name:\tx\n")


# --- detection and decision -----------------------------------------------------------------------


def _which(*present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def _runner(info_code=0, info_out="28.2.2\n", info_err=""):
    calls = []

    def run(argv, timeout=60, env=None):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, info_code, info_out, info_err)
    run.calls = calls
    return run


def _detect(*present, euid=0, capbnd=FULL, **run):
    return enginechoice.detect(which=_which(*present), run=_runner(**run), status_text=_status(capbnd), last_cap=40,
                         euid=euid)


def test_a_reachable_engine_is_used_as_it_is_and_nothing_else_matters():
    facts = _detect("docker", euid=1000, capbnd=NO_SYS_RESOURCE)
    assert facts.engine_reachable and facts.missing_caps == ("CAP_SYS_RESOURCE",)
    decision = enginechoice.decide(facts)
    assert decision == enginechoice.Decision(use_existing=True)  # no wrapper, no dockerd, no install
    assert decision.describe() == "using the machine's Docker engine as it is"


def test_an_unreachable_engine_is_reported_with_dockers_own_words():
    facts = _detect("docker", "dockerd", "runc", info_code=1, info_out="",
                    info_err="Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
                             "daemon running?\n")
    assert not facts.engine_reachable and facts.engine_error.startswith("Cannot connect to the Docker daemon")
    decision = enginechoice.decide(facts)
    assert decision.start_own and not decision.install and not decision.wrapper_drops and not decision.problems


def test_no_cli_means_no_engine_and_nothing_is_run():
    run = _runner()
    facts = enginechoice.detect(which=_which("runc"), run=run, status_text=_status(FULL), last_cap=40, euid=0)
    assert facts.cli is None and not facts.engine_reachable and run.calls == []


def test_root_with_apt_get_installs_docker_io_and_starts_its_own():
    decision = enginechoice.decide(_detect("apt-get", "runc"))
    assert decision.install and decision.start_own and not decision.problems
    assert decision.describe().startswith("installing Debian's docker.io with apt-get; starting a dockerd")


def test_a_docker_cli_without_dockerd_still_needs_the_package():
    decision = enginechoice.decide(_detect("docker", "apt-get", "runc", info_code=1, info_out=""))
    assert decision.install and decision.start_own


def test_missing_capabilities_register_the_wrapper():
    decision = enginechoice.decide(_detect("docker", "dockerd", "runc", capbnd=NO_SYS_RESOURCE, info_code=1, info_out=""))
    assert decision.start_own and decision.wrapper_drops == ("CAP_SYS_RESOURCE",)
    assert "runc wrapper dropping CAP_SYS_RESOURCE" in decision.describe()


@pytest.mark.parametrize("present, euid, problem", [
    (("runc",), 1000, "the docker CLI, dockerd cannot be installed here: not root"),
    (("runc",), 0, "the docker CLI, dockerd cannot be installed here: no apt-get"),
    (("docker", "dockerd", "runc", "apt-get"), 1000, "starting dockerd needs root"),
])
def test_what_cannot_be_done_is_said(present, euid, problem):
    decision = enginechoice.decide(_detect(*present, euid=euid, info_code=1, info_out=""))
    assert not decision.start_own and not decision.install and problem in decision.problems[0]


def test_acquire_refuses_before_creating_anything(tmp_path):
    layout = docker.Layout(tmp_path / "kind-docker")
    facts = _detect("runc", euid=1000)
    with pytest.raises(HarnessError, match="the kind backend has no Docker engine: no reachable Docker engine"):
        docker.acquire("c", layout=layout, facts=facts)
    assert not layout.root.exists()


def test_acquire_uses_the_machines_engine_without_touching_anything(tmp_path):
    layout = docker.Layout(tmp_path / "kind-docker")
    engine = docker.acquire("c", layout=layout, facts=_detect("docker"))
    assert engine == docker.Engine("/usr/bin/docker", {}, owned=False)
    assert not layout.root.exists()
    assert docker.release("c", layout=layout) == []  # nothing recorded, nothing stopped


def test_acquire_refuses_a_socket_path_too_long_for_unix_sockets(tmp_path):
    layout = docker.Layout(tmp_path / ("x" * 120))
    with pytest.raises(HarnessError, match="longer than a unix socket allows"):
        docker.acquire("c", layout=layout, facts=_detect("docker", "dockerd", "runc", info_code=1, info_out=""))
    assert not layout.root.exists()


def test_dockerd_gets_its_own_everything_and_leaves_the_firewall_alone(tmp_path):
    layout = docker.Layout(tmp_path)
    argv = dockerd.dockerd_argv("/usr/sbin/dockerd", layout, None)
    assert argv == ["/usr/sbin/dockerd", f"--host=unix://{tmp_path}/docker.sock", f"--pidfile={tmp_path}/dockerd.pid",
                    f"--data-root={tmp_path}/data", f"--exec-root={tmp_path}/exec",
                    f"--config-file={tmp_path}/daemon.json", "--iptables=false", "--ip6tables=false",
                    "--ip-forward=false", "--bridge=none"]
    with_wrapper = dockerd.dockerd_argv("/usr/sbin/dockerd", layout, tmp_path / "runc-wrapper")
    assert with_wrapper[-2:] == [f"--add-runtime=dra-harness-runc={tmp_path}/runc-wrapper",
                                 "--default-runtime=dra-harness-runc"]


def test_install_blocks_service_starts_only_while_installing(tmp_path):
    policy = tmp_path / "policy-rc.d"
    seen = []

    def run(argv, timeout=60, env=None):
        seen.append((argv[:2], policy.read_text() if policy.exists() else None, env["DEBIAN_FRONTEND"]))
        return subprocess.CompletedProcess(argv, 0, "", "")

    dockerinstall.install_docker(run, policy_rc_d=policy)
    assert seen == [(["apt-get", "install"], seen[0][1], "noninteractive")] and "exit 101" in seen[0][1]
    assert not policy.exists()  # ours, removed
    policy.write_text("#!/bin/sh\nexit 0\n")  # the machine's own: used as it is, left alone
    dockerinstall.install_docker(run, policy_rc_d=policy)
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_a_failed_install_updates_once_then_reports_apts_words(tmp_path):
    calls = []

    def run(argv, timeout=60, env=None):
        calls.append(argv[1])
        return subprocess.CompletedProcess(argv, 100, "", "E: Unable to locate package docker.io\n")

    with pytest.raises(HarnessError, match="exited with 100: E: Unable to locate package docker.io"):
        dockerinstall.install_docker(run, policy_rc_d=tmp_path / "p")
    assert calls == ["install", "update", "install"] and not (tmp_path / "p").exists()


# --- host settings --------------------------------------------------------------------------------


class FakeHost:
    """iptables and /proc/sys as data."""

    def __init__(self, tmp_path: Path, policy="ACCEPT", forward="0"):
        self.policy = {"iptables": policy, "ip6tables": policy}
        self.root = tmp_path / "sys"
        for name, value in (("net.ipv4.ip_forward", forward), ("net.ipv6.conf.all.forwarding", forward)):
            self.proc_sys(name).parent.mkdir(parents=True, exist_ok=True)
            self.proc_sys(name).write_text(value + "\n")

    def proc_sys(self, name):
        return self.root / name.replace(".", "/")

    def run(self, argv):
        binary = Path(argv[0]).name
        if argv[2:] == ["-S", "FORWARD"]:
            return subprocess.CompletedProcess(argv, 0, f"-P FORWARD {self.policy[binary]}\n-A FORWARD -j X\n", "")
        if argv[2:4] == ["-P", "FORWARD"]:
            self.policy[binary] = argv[4]
            return subprocess.CompletedProcess(argv, 0, "", "")
        raise AssertionError(argv)

    def kw(self):
        return {"run": self.run, "which": _which("iptables", "ip6tables"), "proc_sys": self.proc_sys}


def test_forward_policy_is_parsed_from_iptables_s():
    assert hostnet.parse_forward_policy("-P FORWARD DROP\n-N DOCKER\n") == "DROP"
    assert hostnet.parse_forward_policy("") is None


def test_what_dockerd_changed_is_seen_and_put_back(tmp_path):
    host = FakeHost(tmp_path)
    baseline = hostnet.snapshot(**host.kw())
    assert baseline == {"forwardPolicy": {"iptables": "ACCEPT", "ip6tables": "ACCEPT"},
                        "sysctls": {"net.ipv4.ip_forward": "0", "net.ipv6.conf.all.forwarding": "0"}}
    host.policy["iptables"] = "DROP"  # what a default dockerd does
    host.proc_sys("net.ipv4.ip_forward").write_text("1\n")
    assert hostnet.changes(baseline, hostnet.snapshot(**host.kw())) == [
        "iptables FORWARD policy: ACCEPT -> DROP", "net.ipv4.ip_forward: 0 -> 1"]
    assert hostnet.restore(baseline, **host.kw()) == []
    assert hostnet.snapshot(**host.kw()) == baseline
    assert hostnet.changes(baseline, hostnet.snapshot(**host.kw())) == []


# --- the runc wrapper -----------------------------------------------------------------------------


def _config(caps=("CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"), oom=-998):
    caps = list(caps)
    return {"ociVersion": "1.2.0", "process": {"args": ["/pause"], "oomScoreAdj": oom, "capabilities": {
        "bounding": caps, "effective": caps, "permitted": caps, "inheritable": caps, "ambient": caps}},
        "root": {"path": "rootfs"}}


@pytest.fixture
def wrapper(tmp_path):
    """The wrapper as the harness writes it, in front of a fake runc recording argv and what it read."""
    record = tmp_path / "runc-calls.jsonl"
    fake = tmp_path / "runc"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(record)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n")
    fake.chmod(0o755)
    script = wrapper_file.write(tmp_path / "runc-wrapper", sys.executable, str(fake), ["CAP_SYS_RESOURCE"],
                                clamp_oom=True)

    def call(*args, cwd=None):
        result = subprocess.run([str(script), *args], capture_output=True, text=True, cwd=cwd, timeout=60)
        calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
        return result, calls
    return call, fake


def test_create_drops_missing_caps_and_clamps_oom_in_the_bundle_then_execs_runc(tmp_path, wrapper):
    call, fake = wrapper
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(_config()))
    (bundle / "config.json").chmod(0o600)
    argv = ["--root", "/run/runc", "--log", "/tmp/log.json", "--log-format", "json", "--systemd-cgroup", "create",
            "--bundle", str(bundle), "--pid-file", "/tmp/pid", "c1"]
    result, calls = call(*argv)
    assert result.returncode == 0, result.stderr
    assert calls == [[str(fake), *argv]]  # the same arguments, to the real runc
    process = json.loads((bundle / "config.json").read_text())["process"]
    for key in ("bounding", "effective", "permitted", "inheritable", "ambient"):
        assert process["capabilities"][key] == ["CAP_CHOWN", "CAP_SYS_ADMIN"]
    assert process["oomScoreAdj"] == 0
    assert (bundle / "config.json").stat().st_mode & 0o777 == 0o600
    assert not list(bundle.glob("*.dra-harness-tmp"))


@pytest.mark.parametrize("form", ["-b={b}", "--bundle={b}", "-b {b}", "cwd"])
def test_run_finds_the_bundle_in_every_spelling(tmp_path, wrapper, form):
    call, _ = wrapper
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(_config(oom=5)))
    args = [] if form == "cwd" else form.format(b=bundle).split()
    result, calls = call("run", *args, "c2", cwd=bundle)
    assert result.returncode == 0, result.stderr
    process = json.loads((bundle / "config.json").read_text())["process"]
    assert process["capabilities"]["bounding"] == ["CAP_CHOWN", "CAP_SYS_ADMIN"]
    assert process["oomScoreAdj"] == 5  # not negative: left as asked


def test_exec_fixes_the_process_file(tmp_path, wrapper):
    call, _ = wrapper
    process_file = tmp_path / "runc-process123"
    process_file.write_text(json.dumps(_config()["process"]))
    result, calls = call("--root", "/run/runc", "exec", "--process", str(process_file), "--detach", "c1")
    assert result.returncode == 0, result.stderr
    process = json.loads(process_file.read_text())
    assert process["capabilities"]["effective"] == ["CAP_CHOWN", "CAP_SYS_ADMIN"] and process["oomScoreAdj"] == 0
    assert calls[0][1:] == ["--root", "/run/runc", "exec", "--process", str(process_file), "--detach", "c1"]


def test_other_commands_and_clean_files_pass_through_untouched(tmp_path, wrapper):
    call, _ = wrapper
    bundle = tmp_path / "b"
    bundle.mkdir()
    clean = json.dumps(_config(caps=("CAP_CHOWN",), oom=0), indent=3)
    (bundle / "config.json").write_text(clean)
    assert call("create", "--bundle", str(bundle), "c")[0].returncode == 0
    assert (bundle / "config.json").read_text() == clean  # nothing to fix: not rewritten
    result, calls = call("--root", "/run/runc", "delete", "--force", "c")
    assert result.returncode == 0 and calls[-1][1:] == ["--root", "/run/runc", "delete", "--force", "c"]


def test_a_broken_bundle_stops_before_runc_with_a_message(tmp_path, wrapper):
    call, _ = wrapper
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "config.json").write_text("{not json")
    result, calls = call("create", "--bundle", str(bundle), "c")
    assert result.returncode == 1 and calls == []
    assert "runc wrapper (dra-harness): cannot fix" in result.stderr


def test_the_wrapper_source_is_standalone():
    """It runs with the node image's python3 (Debian bookworm, 3.11): standard library only."""
    import ast

    tree = ast.parse(wrapper_file.SOURCE.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"json", "os", "sys"}


def test_when_dockerd_stops_only_the_forward_policy_is_put_back(tmp_path):
    """ip_forward turned on meanwhile may be a real node's bridge: not ours to turn off."""
    host = FakeHost(tmp_path)
    baseline = hostnet.snapshot(**host.kw())
    host.policy["iptables"] = "DROP"
    host.proc_sys("net.ipv4.ip_forward").write_text("1\n")
    assert hostnet.restore(baseline, sysctls=(), **host.kw()) == []
    assert hostnet.changes(baseline, hostnet.snapshot(**host.kw())) == ["net.ipv4.ip_forward: 0 -> 1"]


# --- our own dockerd's life, with a fake dockerd and docker CLI -------------------------------------


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """A fake `dockerd` (a sleeping process that creates its socket) and a fake `docker` CLI whose
    `info` succeeds once the socket exists; the host settings are data."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dockerd").write_text(f"#!{sys.executable}\nimport sys, time, pathlib, signal\n"
                                     "args = dict(a.split('=', 1) for a in sys.argv[1:] if '=' in a)\n"
                                     "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                                     "time.sleep(0.3)\n"
                                     "pathlib.Path(args['--host'][len('unix://'):]).touch()\n"
                                     "open(args['--pidfile'], 'w').write('x')\n"
                                     "time.sleep(600)\n")
    (bin_dir / "docker").write_text("#!/bin/sh\n[ -e \"${1#--host=unix://}\" ] || exit 1\n"
                                    "echo \"$@\" >> \"$(dirname \"$0\")/calls\"\n"
                                    "[ \"$2 $3\" = \"network ls\" ] && printf 'bridge bridge\\nhost host\\nkind bridge\\n'\n"
                                    "exit 0\n")
    for tool in ("dockerd", "docker"):
        (bin_dir / tool).chmod(0o755)
    snapshots = []
    monkeypatch.setattr(dockerd.hostnet, "snapshot", lambda: snapshots.append(1) or {"forwardPolicy": {}})
    restored = []
    monkeypatch.setattr(dockerd.hostnet, "restore", lambda baseline, sysctls=True: restored.append(sysctls) or [])
    monkeypatch.setattr(dockerd, "RUNTIME_DIRS", ())
    machine = []  # the machine-wide record (shared with real nodes): who registered and left, in order
    monkeypatch.setattr(dockerd.machine_settings, "acquire", lambda owner: machine.append(("acquire", owner)) or [])
    monkeypatch.setattr(dockerd.machine_settings, "release", lambda owner: machine.append(("release", owner)) or [])
    facts = enginechoice.Facts(cli=str(bin_dir / "docker"), engine_reachable=False, engine_error="no", dockerd=str(
        bin_dir / "dockerd"), runc="/usr/sbin/runc", root=True, apt_get="/usr/bin/apt-get",
        missing_caps=("CAP_SYS_RESOURCE",))
    return docker.Layout(tmp_path / "kd"), facts, restored, machine


def test_our_dockerd_is_shared_by_its_users_and_stopped_by_the_last(fake_engine):
    layout, facts, restored, machine = fake_engine
    first = docker.acquire("a", layout=layout, facts=facts)
    assert first == docker.Engine(facts.cli, {"DOCKER_HOST": layout.host}, owned=True)
    record = json.loads(layout.record.read_text())
    pid = record["pid"]
    assert record["users"] == ["a"] and record["startedBy"] == "dra-harness" and dockerd.alive(pid)
    assert machine == [("acquire", layout.root)]  # before dockerd started
    # the machine-wide record sees its owner alive while dockerd lives
    assert json.loads(layout.pid_record.read_text())["pid"] == pid
    assert "--default-runtime=dra-harness-runc" in record["argv"]
    assert "DROP = frozenset(['CAP_SYS_RESOURCE'])" in layout.wrapper.read_text()
    assert layout.config_file.read_text() == "{}\n"

    docker.acquire("b", layout=layout, facts=facts)  # the running one is reused
    assert json.loads(layout.record.read_text())["pid"] == pid
    assert json.loads(layout.record.read_text())["users"] == ["a", "b"]

    assert docker.release("a", layout=layout) == [] and dockerd.alive(pid)
    assert docker.release("b", layout=layout) == []
    assert not dockerd.alive(pid) and not layout.record.exists() and not layout.socket.exists()
    assert restored == [()]  # the FORWARD policies here; the kubelets' sysctls by the machine-wide record:
    assert machine == [("acquire", layout.root), ("release", layout.root)]  # registered and left once
    assert not layout.pid_record.exists()
    calls = (Path(facts.cli).parent / "calls").read_text()
    assert f"--host={layout.host} network rm kind" in calls and "network rm bridge" not in calls
    assert f"--host={layout.host} ps --all --quiet" in calls  # no container outlives the last user
    assert docker.release("b", layout=layout) == []  # repeatable


def _register_dead_user(layout, user: str) -> None:
    """`user` as a run SIGKILLed after registering left it: its process is gone."""
    record = json.loads(layout.record.read_text())
    record["users"].append(user)
    record["registeredBy"][user] = {"pid": 2**22 + 7, "createTime": 1.0}  # no such process
    layout.record.write_text(json.dumps(record))


@pytest.mark.parametrize("in_use, stopped", [(False, True), (True, False)])
def test_a_user_a_killed_run_left_is_forgotten_unless_still_in_use(fake_engine, in_use, stopped):
    """A run SIGKILLed while it built the node image registered its cluster and never made its state:
    no `cluster down` can release it. The next release forgets it (its process is gone, nothing in use)
    and stops our dockerd; a user still in use (a cluster with state) keeps it running."""
    layout, facts, _, _ = fake_engine
    docker.acquire("a", layout=layout, facts=facts)
    pid = json.loads(layout.record.read_text())["pid"]
    _register_dead_user(layout, "killed")
    asked = []
    docker.release("a", layout=layout, in_use=lambda user: asked.append(user) or in_use)
    assert asked == ["killed"]  # never the releasing user, never one whose process lives
    assert dockerd.alive(pid) is not stopped and layout.record.exists() is not stopped
    if not stopped:
        assert json.loads(layout.record.read_text())["users"] == ["killed"]
        docker.release("killed", layout=layout)  # its `cluster down`
        assert not dockerd.alive(pid)


def test_a_user_whose_process_lives_is_kept_whatever_in_use_says(fake_engine):
    """Another `up` still building its node image has no cluster state yet: it is not stale."""
    layout, facts, _, _ = fake_engine
    docker.acquire("a", layout=layout, facts=facts)
    docker.acquire("building", layout=layout, facts=facts)  # registered by this (live) process
    assert docker.release("a", layout=layout, in_use=lambda user: False) == []
    record = json.loads(layout.record.read_text())
    assert record["users"] == ["building"] and dockerd.alive(record["pid"])
    docker.release("building", layout=layout)


def test_a_dockerd_that_dies_while_starting_is_reported_with_its_log(fake_engine):
    layout, facts, _, machine = fake_engine
    Path(facts.dockerd).write_text("#!/bin/sh\necho 'failed to start daemon: no space' >&2\nexit 1\n")
    with pytest.raises(HarnessError, match="dockerd exited with 1 while starting") as err:
        docker.acquire("a", layout=layout, facts=facts)
    assert err.value.log_file == layout.log and "no space" in layout.log.read_text()
    assert not layout.socket.exists() and not layout.record.exists()
    assert machine == [("acquire", layout.root), ("release", layout.root)]  # a failed start leaves the record too


def test_what_a_killed_dockerd_of_ours_left_is_cleared_before_ours_starts(fake_engine, monkeypatch):
    """A dockerd of an earlier run killed with its record lost (a session that ended, SIGKILL) still
    names our directory: it is killed, and the mounts under our directory are removed, before the new
    one starts; an engine process of someone else's directory is left alone."""
    layout, facts, _, _ = fake_engine
    unmounted = []
    monkeypatch.setattr(dockerd.teardown, "unmount_all", lambda directory: unmounted.append(directory) or [])
    engine_named = layout.root.parent / "stale" / "dockerd"  # a process whose name is dockerd: a copy of sh
    engine_named.parent.mkdir()
    shutil.copy("/bin/sh", engine_named)
    started = lambda *argv: subprocess.Popen([*argv], start_new_session=True)  # noqa: E731
    stale = started(engine_named, "-c", "sleep 600; :", f"--data-root={layout.data_root}")
    other = started(engine_named, "-c", "sleep 600; :", f"--data-root={layout.root}-other/data")
    log_reader = started("sh", "-c", "sleep 600; :", str(layout.log))  # a user's look at our log
    try:
        docker.acquire("a", layout=layout, facts=facts)
        assert not psutil.pid_exists(stale.pid)  # killed (and reaped) before ours started
        assert other.poll() is None and log_reader.poll() is None
        assert unmounted == [layout.root]
        assert docker.release("a", layout=layout) == []
        assert unmounted == [layout.root, layout.root]  # and after ours stopped: a killed one leaves its mounts
    finally:
        docker.release("a", layout=layout)
        for proc in (stale, other, log_reader):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="bind mounts need root")
def test_the_data_root_mount_of_a_killed_dockerd_is_removed(tmp_path):
    """dockerd bind-mounts its data root onto itself and removes it only on a clean shutdown (seen in CI:
    the mount outlived every later run's `cluster down`). Here the mount is real."""
    layout = docker.Layout(tmp_path / "kd")
    layout.data_root.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(layout.data_root), str(layout.data_root)], check=True)
    try:
        assert dockerd.teardown.mounts_under(layout.root) == [layout.data_root]
        assert dockerd.clear_stale(layout) == []
        assert dockerd.teardown.mounts_under(layout.root) == []
    finally:
        subprocess.run(["umount", "-l", str(layout.data_root)], capture_output=True)


class _Daemon:
    """A fake engine for `docker ps`/`docker rm` whose in-flight `docker run`s finish at given times."""

    def __init__(self, arrivals: dict[float, list[str]], now: list[float]):
        self.arrivals, self.now, self.containers, self.removed = arrivals, now, set(), []

    def run(self, argv, timeout):
        for at in [t for t in self.arrivals if t <= self.now[0]]:
            self.containers.update(self.arrivals.pop(at))
        if argv[1] == "ps":
            return subprocess.CompletedProcess(argv, 0, "\n".join(sorted(self.containers)), "")
        self.removed.append(argv[4:])
        self.containers -= set(argv[4:])
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_containers_that_appear_after_the_first_removal_are_removed_too():
    # Ctrl-C during `kind create cluster`: two node containers exist, the daemon finishes a third
    # `docker run` 3 s later. One pass would leave the third stored as "Created".
    now = [0.0]
    daemon = _Daemon({0.0: ["a", "b"], 3.0: ["c"]}, now)
    sleep = lambda seconds: now.__setitem__(0, now[0] + seconds)  # noqa: E731
    problems = dockerd.remove_containers(["docker"], ("label=x",), run=daemon.run, clock=lambda: now[0],
                                         sleep=sleep, settle=5)
    assert problems == []
    assert daemon.removed == [["a", "b"], ["c"]] and not daemon.containers
    assert now[0] >= 3 + 5  # it waited a quiet period after the last one


def test_containers_that_keep_appearing_are_reported_not_waited_for_forever():
    now = [0.0]
    daemon = _Daemon({float(t): [f"c{t}"] for t in range(0, 400, 2)}, now)
    problems = dockerd.remove_containers(["docker"], (), run=daemon.run, clock=lambda: now[0],
                                         sleep=lambda s: now.__setitem__(0, now[0] + s), settle=5, timeout=30)
    assert len(problems) == 1 and "kept appearing for 30s" in problems[0]
    assert now[0] <= 32


def test_a_failing_docker_is_reported_with_its_words():
    failing = lambda argv, timeout: subprocess.CompletedProcess(argv, 1, "", "Cannot connect to the Docker daemon")  # noqa: E731
    assert dockerd.remove_containers(["docker"], (), run=failing) == ["docker ps: Cannot connect to the Docker daemon"]
