"""The health monitor under test, seen from outside: a way to make a device degraded or failed, a
way to make it recover, and the label selector of the DeviceTaintRules the monitor owns. The tests
in test_health_monitor.py judge a monitor only through these and the API.

- `ReferenceMonitor` (default): fake_devices/healthmonitor.py as its own process, fed by the fake
  driver's fault ConfigMap (the driver itself runs with the `no-fault-taints` variant, so every
  taint the tests see comes from the monitor's rules, not from the slices).
- `CommandMonitor`: a vendor's monitor (vendor mode), reached through the commands of the vendor
  file's `healthMonitor` section (harness/vendor/file.py checks it at load):

      healthMonitor:
        ruleSelector: acme.example/health-monitor=node-agent   # label selector of its DeviceTaintRules
        inject: [acme-fault, inject, "{node}", "{device}", "{kind}"]   # kind: degraded | failed
        recover: [acme-fault, clear, "{node}", "{device}"]

  `CommandMonitor(vendor.health_monitor)` runs them with the placeholders filled in (no shell). The
  harness does not run a vendor's monitor, so it cannot stop it: `stop` returns None.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fake_devices import faults
from fake_devices.healthmonitor import MONITOR_LABEL

DEGRADED, FAILED = "degraded", "failed"
FAULT_KIND = {DEGRADED: "degraded", FAILED: "unhealthy"}  # the fake driver's fault for each state
READY_TIMEOUT = 120.0  # a loaded CI machine (load 35 on 2 cores seen) needs long for imports


@dataclass(frozen=True)
class Target:
    """Where the monitor's source reports a device: node, driver, pool and device name."""

    node: str
    driver: str
    pool: str
    device: str

    @property
    def selector(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.device


class ReferenceMonitor:
    """fake_devices.healthmonitor run as a process for one fake-driver instance."""

    def __init__(self, name: str, kubeconfig: Path, fake_driver, log_dir: Path,
                 health_sockets: dict[str, Path] | None = None, use_faults: bool = True):
        self.name = name
        self.rule_selector = f"{MONITOR_LABEL}={name}"
        self.fake = fake_driver
        self.log = Path(log_dir) / f"health-monitor-{name}.log"
        self.argv = [sys.executable, "-m", "fake_devices.healthmonitor", f"--name={name}", f"--kubeconfig={kubeconfig}"]
        if use_faults:
            config = fake_driver.config
            self.argv += [f"--faults={config.namespace}/{config.faults_configmap}",
                          *(f"--driver={d}" for d in fake_driver.drivers.all())]
        self.argv += [f"--health-socket={d}={p}" for d, p in (health_sockets or {}).items()]
        self.process: subprocess.Popen | None = None

    def start(self) -> "ReferenceMonitor":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT
        while b"ready\n" not in self.log.read_bytes():
            if self.process.poll() is not None:
                raise AssertionError(f"health monitor {self.name} exited with {self.process.returncode} during "
                                     f"start:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"health monitor {self.name} not ready after {READY_TIMEOUT:.0f}s:\n{self.tail()}")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the monitor deletes its rules), SIGKILL if it does not end in time; its exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def inject(self, target: Target, state: str) -> None:
        faults.set_fault(self.fake.core, self.fake.config.namespace, self.fake.config.faults_configmap, target.node,
                         target.device, FAULT_KIND[state])

    def recover(self, target: Target) -> None:
        faults.set_fault(self.fake.core, self.fake.config.namespace, self.fake.config.faults_configmap, target.node,
                         target.device, None)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class CommandMonitor:
    """A vendor's monitor, reached through the commands of a `healthMonitor` section (see above)."""

    COMMAND_TIMEOUT = 60.0

    def __init__(self, section):
        """`section`: harness.vendor.file.HealthMonitor (rule_selector, inject, recover)."""
        self.rule_selector = section.rule_selector
        self._inject, self._recover = list(section.inject), list(section.recover)
        self.name = self.rule_selector
        self._ran: list[str] = []  # what it ran, with output, for failure messages

    def _run(self, argv: list[str], **values: str) -> None:
        filled = [argv[0], *(arg.format(**values) for arg in argv[1:])]
        try:
            done = subprocess.run(filled, capture_output=True, text=True, timeout=self.COMMAND_TIMEOUT,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"health monitor command {filled} did not finish in {self.COMMAND_TIMEOUT:.0f}s")
        self._ran.append(f"$ {' '.join(filled)} -> {done.returncode}\n{(done.stdout + done.stderr).strip()[-500:]}")
        if done.returncode != 0:
            raise AssertionError(f"health monitor command {filled} exited with {done.returncode}: "
                                 f"{(done.stderr or done.stdout).strip()[-2000:]}")

    def inject(self, target: Target, state: str) -> None:
        self._run(self._inject, node=target.node, driver=target.driver, pool=target.pool, device=target.device,
                  kind=state)

    def recover(self, target: Target) -> None:
        self._run(self._recover, node=target.node, driver=target.driver, pool=target.pool, device=target.device)

    def stop(self, timeout: float = 0.0) -> int | None:
        return None  # not ours to stop

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self._ran[-lines:])


def rules_of(k8s, monitor) -> list:
    """The DeviceTaintRules the monitor owns right now."""
    return k8s.resource.list_device_taint_rule(label_selector=monitor.rule_selector).items


def selected(rule) -> tuple[str | None, str | None, str | None]:
    selector = rule.spec.device_selector
    return (selector.driver, selector.pool, selector.device) if selector else (None, None, None)


def describe_rules(rules: list) -> str:
    return "; ".join(f"{r.metadata.name}: {'/'.join(str(s) for s in selected(r))} "
                     f"{r.spec.taint.key}={r.spec.taint.value}:{r.spec.taint.effect}" for r in rules) or "(none)"
