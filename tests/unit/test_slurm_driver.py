"""Reading Slurm's answers and what a dry run would run (no Slurm needed here)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from actions.config import parse_config
from actions.drivers.scheduler_steps import node_of
from actions.drivers.slurm.cli import (
    MAX_REASON,
    NodeInfo,
    Output,
    Slurm,
    SlurmError,
    drain_reason,
    drained_for,
    parse_job,
)
from actions.drivers.slurm.executors import SlurmIsolateExecutor, SlurmRestartExecutor
from actions.pipeline.executor import Context
from actions.pipeline.outcome import Reason, Result
from actions.pipeline.policy import Step
from actions.state.model import Claim, Component, Transition, TransitionRequest
from schemas.files import Topology
from tests.unit.test_actions_pipeline import diagnosis
from topology.generate import Shape, generate
from topology.slurm_conf import TOP_SWITCH, render_topology_conf

SHOW_JOB = (
    "JobId=42 JobName=train.sh UserId=root(0) JobState=PENDING Reason=BeginTime "
    "Requeue=1 Restarts=2 BatchFlag=1 NodeList=(null) ExcNodeList=node-[001-002] "
    "AdminComment=c4:requeue=d-5c1e@1 Command=/tmp/train.sh"
)


def test_a_job_line_is_read_with_c4s_mark() -> None:
    job = parse_job(SHOW_JOB)
    assert (job.job_id, job.state, job.restarts) == ("42", "PENDING", 2)
    assert (job.nodes, job.excluded) == ("", "node-[001-002]")
    assert job.mark() == ("d-5c1e", 1)
    assert parse_job("JobId=7 JobState=RUNNING AdminComment=(null)").mark() is None
    assert parse_job("JobId=7 AdminComment=c4:requeue=d-1@x").mark() is None
    with pytest.raises(SlurmError, match="no job in scontrol's answer"):
        parse_job("slurm_load_jobs error: Invalid job id specified")


@pytest.mark.parametrize(
    ("state", "drained"),
    [
        ("idle", False),
        ("idle*", False),
        ("mixed", False),
        ("drained", True),
        ("draining", True),
        ("drained*", True),
        ("down", False),
    ],
)
def test_drained_is_read_from_sinfos_long_state(state: str, drained: bool) -> None:
    assert NodeInfo("node-000", state, "").drained is drained


def test_c4s_reasons_say_which_diagnosis_and_part() -> None:
    reason = drain_reason("d-1", "gpu_fault", "node-001/gpu3")
    assert reason == "c4:d-1 gpu_fault node-001/gpu3"
    assert drained_for(reason) == "node-001/gpu3"
    assert drained_for("disk check by ops") is None
    assert NodeInfo("node-001", "drained", reason).drained_by_c4
    assert not NodeInfo("node-001", "drained", "disk check").drained_by_c4
    assert len(drain_reason("d-1", "gpu_fault", "x" * 500)) == MAX_REASON
    assert (node_of("gpu", "node-001/gpu3"), node_of("port", "node-1/mlx5_0:1")) == (
        "node-001",
        "node-1",
    )
    assert node_of("link", "leaf-0a--spine-0") is None


def test_a_dry_run_shows_the_commands_it_would_run() -> None:
    config = parse_config({"scheduler": {"kind": "slurm"}}, {})
    found = diagnosis()
    isolate = SlurmIsolateExecutor(None, config, None, lambda letter, key: None)  # type: ignore[arg-type]
    assert isolate.preview(Step("isolate", "node-002/gpu1", "gpu"), found) == [
        "scontrol update NodeName=node-002 State=DRAIN 'Reason=c4:d-1 noncomm_hang node-002/gpu1'"
    ]
    assert isolate.preview(Step("isolate", "leaf-0a", "switch"), found) == []
    restart = SlurmRestartExecutor(config, None, lambda letter, key: None)  # type: ignore[arg-type]
    assert restart.preview(Step("restart", "42", "job", nodes=("node-002",)), found) == [
        "scontrol update JobId=42 'AdminComment=c4:requeue=d-1@<restarts>'",
        "scontrol requeue 42",
        "scontrol update JobId=42 ExcNodeList=node-002",
        "scontrol update JobId=42 StartTime=now",
    ]


def test_topology_conf_puts_nodes_under_their_first_ports_leaf() -> None:
    topology = generate(Shape(nodes=4, spines=2, nics=1, planes=2, nodes_per_leaf=2, gpus=8))
    assert isinstance(topology, Topology)
    lines = render_topology_conf(topology).splitlines()
    assert lines[1:3] == [
        "SwitchName=leaf-0a Nodes=node-000,node-001",
        "SwitchName=leaf-1a Nodes=node-002,node-003",
    ]
    assert "SwitchName=spine-a-0 Switches=leaf-0a,leaf-1a" in lines
    assert lines[-1] == f"SwitchName={TOP_SWITCH} Switches=spine-a-0,spine-a-1"


class ScriptedSlurm:
    """Answers ``scontrol show job`` with one line and records every change asked of it."""

    def __init__(self, job_line: str) -> None:
        self.job_line = job_line
        self.changes: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> Output:
        if list(args[:3]) == ["scontrol", "-o", "show"]:
            return Output(0, self.job_line, "")
        self.changes.append(list(args))
        return Output(1, "", "refused in this test")


def requeue_for(onset_s: int, job_line: str) -> tuple[Result, ScriptedSlurm]:
    config = parse_config({"scheduler": {"kind": "slurm"}}, {})
    slurm = ScriptedSlurm(job_line)
    restart = SlurmRestartExecutor(config, Slurm(slurm), lambda letter, key: None)
    found = diagnosis().model_copy(update={"onset_ns": onset_s * 10**9, "ts_ns": onset_s * 10**9})
    context = Context(found, Claim("claim:d-1", "1"), (), "test", found.ts_ns)
    return restart.execute(Step("restart", "42", "job", nodes=("node-002",)), context), slurm


def test_a_finding_about_an_earlier_run_requeues_nothing() -> None:
    # The job was requeued (Slurm moved its SubmitTime to then) for another finding; a
    # finding that began before that is about the run that was stopped.
    line = "JobId=42 JobState=RUNNING Restarts=1 SubmitTime=2026-12-05T00:13:12 NodeList=n1"
    queued = parse_job(line).submitted_s
    assert queued is not None and time.localtime(queued)[:6] == (2026, 12, 5, 0, 13, 12)
    result, slurm = requeue_for(queued - 3, line)
    assert (result.status, result.reason) == ("skipped", Reason.EARLIER_RUN)
    assert slurm.changes == []
    # A finding about the current run is acted on (here Slurm refuses the change).
    result, slurm = requeue_for(queued + 5, line)
    assert result.reason is Reason.SCHEDULER_REJECTED and slurm.changes
    # No SubmitTime (or one Slurm could not give): no such check.
    assert parse_job("JobId=42 SubmitTime=Unknown").submitted_s is None


class OneComponent:
    """The cluster state of one node: healthy (or as a transition left it)."""

    def __init__(self, state: str = "healthy", diagnosis: str = "") -> None:
        self.current = Component("node", "node-002", state, 1, diagnosis=diagnosis)
        self.requests: list[TransitionRequest] = []

    def component(self, kind: str, ident: str) -> Component | None:
        return self.current if (kind, ident) == ("node", "node-002") else None

    def transition(self, request: TransitionRequest) -> Transition:
        self.requests.append(request)
        self.current = Component("node", "node-002", "isolated", 2, diagnosis=request.diagnosis)
        return Transition("ok", epoch=2)


def isolate_for(
    onset_s: int, job_line: str, components: OneComponent | None = None
) -> tuple[Result, ScriptedSlurm, OneComponent]:
    config = parse_config({"scheduler": {"kind": "slurm"}}, {})
    slurm = ScriptedSlurm(job_line)
    state = components or OneComponent()
    isolate = SlurmIsolateExecutor(state, config, Slurm(slurm), lambda letter, key: None)
    found = diagnosis().model_copy(
        update={"job": "42", "onset_ns": onset_s * 10**9, "ts_ns": onset_s * 10**9}
    )
    context = Context(found, Claim("claim:d-1", "1"), (), "test", found.ts_ns)
    return isolate.execute(Step("isolate", "node-002", "node"), context), slurm, state


def test_a_finding_about_an_earlier_run_drains_nothing() -> None:
    # The same stopped ranks seen again from the requeued run's last reports: a second
    # finding of one fault. Its drain would take out a node given back since.
    line = "JobId=42 JobState=RUNNING Restarts=1 SubmitTime=2026-12-05T00:13:12 NodeList=n1"
    queued = parse_job(line).submitted_s
    assert queued is not None
    result, slurm, state = isolate_for(queued - 3, line)
    assert (result.status, result.reason) == ("skipped", Reason.EARLIER_RUN)
    assert "earlier run" in result.message and result.detail["node"] == "node-002"
    assert slurm.changes == [] and state.requests == []  # neither drained nor marked
    # A finding about the current run is isolated: marked, then Slurm is asked to drain.
    result, slurm, state = isolate_for(queued + 5, line)
    assert state.requests and slurm.changes[0][:2] == ["sinfo", "-h"]
    # The finding's own requeue started the current run: a retry of its isolate goes on.
    own = line + " AdminComment=c4:requeue=d-1@0"
    result, slurm, state = isolate_for(queued - 3, own)
    assert state.requests and result.reason is not Reason.EARLIER_RUN
    # Isolated by it already (a retry after a crash): not asked again, whatever the run.
    result, slurm, state = isolate_for(queued - 3, line, OneComponent("isolated", "d-1"))
    assert result.reason is not Reason.EARLIER_RUN


def test_an_isolate_for_a_job_slurm_does_not_know_goes_on() -> None:
    config = parse_config({"scheduler": {"kind": "slurm"}}, {})
    state = OneComponent()

    def unknown(args: Sequence[str]) -> Output:
        if list(args[:3]) == ["scontrol", "-o", "show"]:
            return Output(1, "", "slurm_load_jobs error: Invalid job id specified")
        return Output(0, "", "")

    isolate = SlurmIsolateExecutor(state, config, Slurm(unknown), lambda letter, key: None)
    found = diagnosis().model_copy(update={"job": "job-7"})
    context = Context(found, Claim("claim:d-1", "1"), (), "test", found.ts_ns)
    result = isolate.execute(Step("isolate", "node-002", "node"), context)
    assert result.reason is not Reason.EARLIER_RUN and state.requests  # on to the drain
