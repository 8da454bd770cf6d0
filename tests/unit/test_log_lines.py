"""What a failed test's diagnostics quote from a component log: the lines that name its namespace,
however far back, the latest last."""

from __future__ import annotations

from harness.core.files import lines_naming, tail


def test_lines_naming_a_namespace_come_from_the_whole_log(tmp_path):
    log = tmp_path / "kube-scheduler.log"
    log.write_text("".join(f"I1202 line {i} pod=dra-t-abc/p{i}\n" if i % 100 == 0 else f"I1202 line {i} other\n"
                           for i in range(5000)))
    found = lines_naming(log, "dra-t-abc", lines=3).splitlines()
    assert found == [f"I1202 line {i} pod=dra-t-abc/p{i}" for i in (4700, 4800, 4900)]
    assert "dra-t-abc" not in tail(log, 30)  # why the tail alone does not explain a pod that waited long
    assert lines_naming(log, "dra-t-zzz") == ""
    assert lines_naming(tmp_path / "missing.log", "dra-t-abc") == ""
