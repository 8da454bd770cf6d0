"""The conditions arithmetic (harness/core/conditions.py) on made-up snapshots: own vs others' CPU, the
share of the machine, and the contended verdict."""

from __future__ import annotations

from collections import namedtuple

import pytest

from harness.core import conditions

SystemTimes = namedtuple("SystemTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
ProcTimes = namedtuple("ProcTimes", "user system children_user children_system")


def _snap(wall, busy, own, load=(1.0, 1.0, 1.0)):
    return conditions.Snapshot(wall=wall, load_average=load, machine_busy=busy, own=own)


def test_machine_busy_counts_busy_fields_only():
    times = SystemTimes(user=10, nice=1, system=5, idle=100, iowait=7, irq=2, softirq=3, steal=4, guest=6, guest_nice=1)
    # guest time is already inside user/nice; idle and iowait are not busy
    assert conditions.machine_busy_seconds(times) == 10 + 1 + 5 + 2 + 3 + 4


def test_process_seconds_include_reaped_children():
    assert conditions.process_seconds(ProcTimes(1.5, 0.5, 2.0, 1.0)) == 5.0


def test_others_are_machine_busy_minus_own():
    start = _snap(100.0, busy=1000.0, own={(1, 0.0): 10.0, (2, 0.0): 5.0})
    end = _snap(110.0, busy=1012.0, own={(1, 0.0): 14.0, (2, 0.0): 7.0})  # own +6 s, machine +12 s
    result = conditions.summarize(start, end, cpus=2)
    assert result["window_seconds"] == 10.0
    assert result["own_cpu_seconds"] == 6.0 and result["others_cpu_seconds"] == 6.0
    assert result["own_percent_of_machine"] == 30.0  # 6 s of 2 cores x 10 s
    assert result["others_percent_of_machine"] == 30.0
    assert result["contended"] is True


def test_quiet_machine_is_not_contended():
    start = _snap(0.0, busy=500.0, own={(1, 0.0): 1.0})
    end = _snap(20.0, busy=530.0, own={(1, 0.0): 27.0})  # others 4 s of 40 = 10%: not more than 10
    result = conditions.summarize(start, end, cpus=2)
    assert result["others_percent_of_machine"] == 10.0
    assert result["contended"] is False


def test_processes_started_and_ended_in_the_window():
    # pid 3 started in the window: all its CPU is own. pid 2 exited and was reaped by pid 1, whose
    # children's times now hold its whole life (5 s before + 1 s in the window): own grows by 1 s only.
    start = _snap(0.0, busy=100.0, own={(1, 0.0): 10.0, (2, 0.0): 5.0})
    end = _snap(10.0, busy=110.0, own={(1, 0.0): 10.0 + 6.0, (3, 9.0): 2.0})
    result = conditions.summarize(start, end, cpus=1)
    assert result["own_cpu_seconds"] == 3.0
    assert result["others_cpu_seconds"] == 7.0


def test_pid_reuse_is_a_different_process():
    start = _snap(0.0, busy=0.0, own={(7, 1.0): 50.0})
    end = _snap(10.0, busy=5.0, own={(7, 2.0): 1.0})  # pid 7 exited unreaped; a new process got the pid
    result = conditions.summarize(start, end, cpus=1)
    assert result["own_cpu_seconds"] == 0.0  # never negative
    assert result["others_cpu_seconds"] == 5.0  # conservative: the run looks more contended, not less


@pytest.mark.parametrize("own_end, contended", [(1000.0 + 19.0, False), (1000.0 + 17.0, True)])
def test_contended_threshold_is_ten_percent_of_all_cores(own_end, contended):
    start = _snap(0.0, busy=0.0, own={(1, 0.0): 1000.0})
    end = _snap(10.0, busy=20.0, own={(1, 0.0): own_end})  # 2 cores x 10 s = 20 CPU seconds
    assert conditions.summarize(start, end, cpus=2)["contended"] is contended


def test_describe_and_measure_on_this_machine():
    with conditions.Measure() as window:
        sum(i * i for i in range(200_000))  # some CPU of our own
    result = window.result
    assert result["own_cpu_seconds"] >= 0 and result["others_cpu_seconds"] >= 0
    assert result["cpus"] >= 1 and len(result["load_average_start"]) == 3
    line = conditions.describe(result)
    assert ("CONTENDED" in line) == result["contended"]
    assert "others used" in line


@pytest.mark.parametrize("command, expected", [
    (["/root/.cache/dra-harness/binaries/v1.37.2/kube-apiserver", "--etcd-servers=http://127.0.0.1:2379"],
     "kube-apiserver"),
    (["etcd", "--data-dir=/x"], "etcd"),
    (["/usr/bin/python3", "-m", "fake_devices", "--config=/x/fake-driver.yaml"], "fake driver"),
    (["/v/bin/python", "-m", "fake_devices.kubeletplugin", "--node=real-node-0"], "kubelet plugins"),
    (["/v/bin/python3", "/v/bin/locust", "-f", "load/locustfile.py", "--headless"], "locust"),
    (["/v/bin/python", "-m", "harness.backends.local.supervisor", "--cluster-dir", "/x"], "supervisor"),
    (["/v/bin/python", "-m", "harness.cli", "load", "run"], "harness"),
    ([], "other"),
])
def test_role_names_the_program_a_process_runs(command, expected):
    assert conditions.role(command) == expected


def test_own_cpu_is_split_by_role():
    apiserver, driver, gone, new = (1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0)
    start = conditions.Snapshot(0.0, (1.0,) * 3, 0.0, own={apiserver: 10.0, driver: 5.0, gone: 1.0},
                                roles={apiserver: "kube-apiserver", driver: "fake driver", gone: "locust"})
    end = conditions.Snapshot(10.0, (1.0,) * 3, 20.0, own={apiserver: 16.0, driver: 6.0, new: 2.5},
                              roles={apiserver: "kube-apiserver", driver: "fake driver", new: "kube-apiserver"})
    # the apiserver's 6 s plus a new process of the same role (2.5 s, all in the window); the exited one is gone
    assert conditions.summarize(start, end, cpus=2)["own_cpu_by_role"] == {"kube-apiserver": 8.5, "fake driver": 1.0}
