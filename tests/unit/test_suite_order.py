"""The order `dra-harness run` hands the suite's tests out in (plugin.suite_order), and how it hands them out."""

from pathlib import Path

from harness.jobs import runner
from harness.pytest_plugin.plugin import suite_order


class Item:
    """Just what the ordering looks at: markers and fixture names."""

    def __init__(self, name, markers=(), fixtures=(), path="/repo/conformance/test_x.py"):
        self.name, self.markers, self.fixturenames, self.path = name, set(markers), list(fixtures), Path(path)

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def test_restarts_first_then_short_tests_then_long_waits_then_kubelet_tests():
    items = [Item("kubelet-a", fixtures=["real_node"]), Item("short-a"), Item("wipe", {"long_wait"}, ["real_node"]),
             Item("reboot", {"disrupts_node"}, ["real_node"]), Item("kubelet-b", {"needs_kubelet"}),
             Item("short-b"), Item("restart", {"disrupts_node"}, ["real_node"])]
    assert [i.name for i in suite_order(items)] == [
        "reboot", "restart", "short-a", "short-b", "wipe", "kubelet-a", "kubelet-b"]


def test_other_tests_keep_their_places_and_the_suite_is_ordered_within_its_own():
    # `make test`: tests/ and conformance/ in one session; the harness's own tests must not wait behind the suite
    items = [Item("unit-a", path="/repo/tests/unit/test_a.py"), Item("kubelet", fixtures=["real_node"]),
             Item("integration", fixtures=["real_node"], path="/repo/tests/integration/test_conformance_x.py"),
             Item("reboot", {"disrupts_node"}, ["real_node"]), Item("short")]
    assert [i.name for i in suite_order(items)] == ["unit-a", "reboot", "integration", "short", "kubelet"]


def test_the_order_is_the_same_in_every_worker():
    # xdist refuses to run when its workers collected different orders
    items = [Item(f"t{i}", fixtures=["real_node"] if i % 3 else []) for i in range(30)]
    assert [i.name for i in suite_order(items)] == [i.name for i in suite_order(list(items))]


def test_run_hands_the_tests_out_one_at_a_time_to_its_workers(tmp_path):
    options = runner.ConformanceOptions(report_dir=tmp_path)
    command = runner._pytest_command(options, Path(tmp_path / "cluster.json"))
    assert command[command.index("-n") + 1] == "6"
    assert command[command.index("--dist") + 1] == "load" and command[command.index("--maxschedchunk") + 1] == "1"


def test_one_worker_runs_in_one_process(tmp_path):
    command = runner._pytest_command(runner.ConformanceOptions(report_dir=tmp_path, workers=1), tmp_path / "c.json")
    assert "-n" not in command and "--dist" not in command
