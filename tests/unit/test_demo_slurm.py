"""``c4 demo --slurm`` without a cluster: its figures, table and report, the job script, the
measurement after a fault against a scripted Slurm, the straggler's duty cycle, the flags."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from actions.drivers.slurm.cli import JobInfo, NodeInfo
from c4.cli import main
from c4.dashboard.model import FeedView
from c4.demo.slurm_faults import Faults, Throttle
from c4.demo.slurm_figures import (
    HANG_CLASSES,
    Bounds,
    FalseFinding,
    FaultRecord,
    JobEnd,
    figures,
    passed,
    report,
    summary_lines,
    table,
)
from c4.demo.slurm_job import TRAINING_SCRIPT, JobFiles, job_script
from c4.demo.timeline import format_rows
from tests.unit.test_demo_timeline import action, finding

S = 1_000_000_000
T0 = 1_800_000_000_000_000_000
BOUNDS = Bounds(silent_after_s=3.0, hang_min_s=5.0)


def hang(at_s: float, to_drain_s: float, cls: str = "node_down", **extra: Any) -> FaultRecord:
    injected = T0 + int(at_s * S)
    drained = injected + int(to_drain_s * S)
    fields: dict[str, Any] = {
        "diagnosis_id": "d-1",
        "diagnosis": cls,
        "suspect": "node-001",
        "diagnosis_ts_ns": injected + int((to_drain_s - 0.2) * S),
        "drained_ns": drained,
        "reason": f"c4:d-1 {cls} node-001",
        "sinfo_line": "c4:d-1 node_down nod root 2026-01-01T00:00:00 node-001",
        "requeued_ns": drained + S // 10,
        "running_ns": drained + 3 * S,
        "restarts": 1,
        "job_state": "RUNNING",
        "nodes_after": ("node-000", "node-002", "node-003"),
    }
    fields.update(extra)
    return FaultRecord("hang", "node-001", (4242,), injected, 0, **fields)


COMPLETED = JobEnd("7", "COMPLETED", "0:0", 2, "node-[000-002]")


def test_the_figures_are_the_median_and_the_worst_against_the_class_bound() -> None:
    records = [hang(10, 3.2), hang(40, 4.0), hang(70, 7.5, cls="noncomm_hang")]
    found = figures(records, BOUNDS)
    assert (found.hang_to_drain.p50_s, found.hang_to_drain.worst_s) == (4.0, 7.5)
    # A node_down is due by silent_after + 3 s, a noncomm_hang by hang_min + 3 s.
    assert found.hang_targets_s == (6.0, 6.0, 8.0)
    assert found.hangs_within
    assert found.drained_to_running.p50_s == 3.0
    assert found.requeue_to_running.worst_s == 2.9
    late = figures([hang(10, 6.5)], BOUNDS)
    assert not late.hangs_within


def test_a_run_passes_only_with_every_fault_acted_on_and_the_job_completed() -> None:
    good = hang(10, 3.2)
    assert good.ok and passed([good], COMPLETED)
    assert not passed([good], JobEnd("7", "FAILED", "1:0", 1, "node-000"))
    assert not passed([good], None)
    never_drained = hang(10, 3.2, drained_ns=None, reason=None)
    assert never_drained.found and not never_drained.acted
    back_on_it = hang(10, 3.2, nodes_after=("node-001", "node-002", "node-003"))
    assert not back_on_it.ok
    a_persons_drain = hang(10, 3.2, reason="disk check")
    assert not a_persons_drain.ok
    missed = hang(10, 3.2, diagnosis=None)
    assert not missed.ok and not passed([missed], COMPLETED)


def test_the_table_and_the_summary_say_it_all() -> None:
    records = [hang(10, 3.2)]
    straggler = FaultRecord(
        "straggler",
        "node-003",
        (5151,),
        T0 + 30 * S,
        1,
        diagnosis_id="d-2",
        diagnosis="noncomm_slow",
        suspect="node-003/gpu0",
        diagnosis_ts_ns=T0 + 38 * S,
        drained_ns=T0 + 38 * S + S // 2,
        reason="c4:d-2 noncomm_slow node-003/gpu0",
        requeued_ns=T0 + 39 * S,
        running_ns=T0 + 42 * S,
        restarts=2,
        job_state="RUNNING",
        nodes_after=("node-000", "node-001", "node-002"),
    )
    records.append(straggler)
    false = FalseFinding("d-9", "noncomm_hang", "node-002/gpu0", 20 * S, ("isolate x done",), True)
    text = format_rows(table(records, T0, [false]))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["at", "s", "injected"]
    assert "c4:d-1 node_down node-001" in lines[2] and lines[2].split()[0] == "10.0"
    assert re.search(r"node-003 +noncomm_slow +node-003/gpu0 +8\.0 +8\.5 +3\.5 +3\.0", lines[3])
    assert "FALSE noncomm_hang" in lines[4] and "isolate x done" in lines[4]
    found = figures(records, BOUNDS)
    said = summary_lines(records, found, COMPLETED, [false])
    assert said[0].startswith("hang to drain: p50 3.2 s, worst 3.2 s over 1 of 1 hangs")
    assert "target 6.0 s for a node_down (silent_after 3 s + 3 s" in said[0]
    assert said[0].endswith("within")
    assert "of which Slurm's requeue to running: p50 3.0 s, worst 3.0 s" in said[1]
    assert said[2] == "straggler: named after 8.0 s of throttling, its node drained after 8.5 s"
    assert said[3].startswith("FALSE finding: noncomm_hang node-002/gpu0 at 20.0 s (d-9)")
    assert said[-1].startswith("PASS: 2/2 faults found, 2/2 acted on")
    assert said[-1].endswith("1 false findings, 1 of them drained a healthy node")
    document = report("run1", records, found, COMPLETED, [false], T0)
    assert document["passed"] and document["job"]["completed"]
    assert document["faults"][0]["to_drain_s"] == 3.2
    assert document["faults"][1]["latency_s"] == 8.0
    assert document["figures"]["hang_to_drain"] == {"p50_s": 3.2, "worst_s": 3.2, "count": 1}
    assert document["figures"]["bounds"]["silent_after_s"] == 3.0
    assert document["false_findings"][0]["at_s"] == 20.0


def test_the_default_bounds_are_the_detectors() -> None:
    bounds = Bounds.defaults()
    assert (bounds.silent_after_s, bounds.hang_min_s) == (3.0, 5.0)
    assert bounds.target_s("node_down") == 6.0 and bounds.target_s("noncomm_hang") == 8.0


def test_the_job_runs_the_packaged_script_under_c4_run_one_handoff_per_node(
    tmp_path: Path,
) -> None:
    script = job_script(tmp_path, 300)
    assert "#SBATCH -N 3" in script and "#SBATCH --requeue" in script
    assert f"C4_HANDOFF_DIR={tmp_path}/handoff/$SLURMD_NODENAME exec" in script
    assert f"-m c4.cli run -- {sys.executable} {TRAINING_SCRIPT} {tmp_path}/train 300" in script
    assert TRAINING_SCRIPT.parent.name == "demo" and TRAINING_SCRIPT.is_file()


def test_the_training_script_imports_nothing_of_c4() -> None:
    tree = ast.parse(TRAINING_SCRIPT.read_text(encoding="utf-8"))
    roots = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert roots <= {"os", "sys", "time", "pathlib", "torch"}, roots


def test_the_job_files_give_each_rank_its_pid_and_node(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    assert files.ranks(0) == {} and files.progress(0) is None
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "r1.rank2").write_text("303 node-003\n")
    (tmp_path / "pids" / "r1.rank0").write_text("101 node-000\n")
    (tmp_path / "pids" / "r1.rank1").write_text("")  # being written
    (tmp_path / "pids" / "r0.rank0").write_text("11 node-000\n")
    assert files.ranks(1) == {0: (101, "node-000"), 2: (303, "node-003")}
    (tmp_path / "progress.r1").write_text("40\n")
    assert files.progress(1) == 40


class ScriptedSlurm:
    """Slurm as a fault plays out: drained on the 3rd poll, requeued on the 4th, running
    again on the 6th."""

    def __init__(self) -> None:
        self.polls = 0
        self.resumed = False

    def node(self, name: str) -> NodeInfo:
        drained = self.polls >= 2 and not self.resumed
        return NodeInfo(name, "draining" if drained else "mixed", "c4:d-1 node_down node-001")

    def reason(self, node: str) -> tuple[str, str]:
        return "c4:d-1 node_down node-001", "c4:d-1 node_down nod root 2026 node-001"

    def job(self, job_id: str) -> JobInfo:
        self.polls += 1
        if self.polls < 4:
            return JobInfo(job_id, "RUNNING", 0, "node-[000-002]", "", "")
        if self.polls < 6:
            return JobInfo(job_id, "PENDING", 1, "", "", "")
        return JobInfo(job_id, "RUNNING", 1, "node-[000,002-003]", "", "")

    def nodes_of(self, info: JobInfo) -> list[str]:
        return {"node-[000-002]": ["node-000", "node-001", "node-002"]}.get(
            info.nodes, ["node-000", "node-002", "node-003"]
        )


class ScriptedFeed:
    def __init__(self, view: FeedView) -> None:
        self._view = view

    def view(self) -> FeedView:
        return self._view


def scripted_faults(view: FeedView, released: list[str]) -> Faults:
    slurm = ScriptedSlurm()

    def release(part: str) -> tuple[int, str]:
        released.append(part)
        slurm.resumed = True
        return 0, f"node {part} released slurm: {part} resumed"

    return Faults(
        slurm,  # type: ignore[arg-type]
        ScriptedFeed(view),  # type: ignore[arg-type]
        "7",
        JobFiles(Path("/nonexistent")),
        release,
        lambda: None,
        lambda line: None,
    )


def test_a_hang_is_followed_from_the_stop_to_the_next_run() -> None:
    now = time.time_ns()
    stale = finding("d-0", "node_down", ("node", "node-001"), 0, job="7").model_copy(
        update={"ts_ns": now - 10 * S}
    )
    fresh = finding("d-1", "node_down", ("node", "node-001"), 0, job="7").model_copy(
        update={"ts_ns": now + 3 * S}
    )
    other = finding("d-2", "noncomm_hang", ("gpu", "node-002/gpu0"), 0, job="7").model_copy(
        update={"ts_ns": now + 20 * S}
    )
    actions = (action("d-2", "isolate", "node-002/gpu0"), action("d-2", "alert", "x"))
    released: list[str] = []
    faults = scripted_faults(FeedView((stale, fresh, other), actions), released)
    record = FaultRecord("hang", "node-001", (1,), now, 0)
    faults._follow(record, {"d-0"}, HANG_CLASSES, 30)
    assert (record.diagnosis_id, record.diagnosis, record.suspect) == (
        "d-1",
        "node_down",
        "node-001",
    )
    assert record.latency_ns == 3 * S
    assert record.reason == "c4:d-1 node_down node-001"
    assert record.drained_ns is not None and record.requeued_ns is not None
    assert record.running_ns is not None and record.running_ns > record.requeued_ns
    assert record.restarts == 1 and record.nodes_after == ("node-000", "node-002", "node-003")
    assert record.ok and faults.restart == 1
    faults.give_back(record)
    assert released == ["node-001"] and "released" in record.released
    others = faults.others([record], now)
    # Before the fault or naming another node: false, with what was done about each.
    assert [(o.id, o.drained, o.actions) for o in others] == [
        ("d-0", False, ()),
        ("d-2", True, ("isolate node-002/gpu0 done",)),
    ]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_straggler_duty_cycle_stops_and_continues_then_leaves_it_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        throttle = Throttle([child.pid]).start()
        seen = set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and seen != {"T", "S"}:
            seen.add(_state(child.pid))
            time.sleep(0.007)
        throttle.stop()
        assert "T" in seen, seen  # stopped part of the time
        time.sleep(0.05)
        assert _state(child.pid) != "T"  # and running at the end
    finally:
        child.kill()
        child.wait(10)


def test_the_slurm_demo_is_roots_only_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["demo", "--slurm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("c4: error: c4 demo --slurm needs root") and "\n" not in err


def test_the_slurm_flags_go_with_slurm_and_only_with_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--hangs", "2"]) == 2
    assert "--hangs and --steps go with --slurm" in capsys.readouterr().err
    assert main(["demo", "--slurm", "--chaos", "3"]) == 2
    assert "--slurm runs its own job: --chaos do not apply" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--slurm", "--hangs", "0"])


def test_split_is_the_simulated_demos_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--slurm", "--split"]) == 2
    assert "--slurm runs its own job: --split do not apply" in capsys.readouterr().err
