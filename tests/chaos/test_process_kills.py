"""kill -9 of every process of the system, one at a time, at random moments of a live run.

The whole system runs as `c4 demo --chaos` does, on a Kafka and a Redis of this test's own:
the streams worker, the actions worker and a node agent as processes, the simulated
cluster handing its records to the agent, six scripted faults. Each of the five processes
(streams worker, actions worker, node agent, Kafka, Redis) is killed with SIGKILL once, in
a random order after a random pause, and started again; the next kill waits until the
pipeline has caught up. At the end every fault must be diagnosed and acted on, nothing
raised falsely, and the audit must find nothing done twice: no diagnosis (id, state)
published twice, no action done twice, no node isolated twice, every spare taken placed in
exactly one job. The seed is random per run: printed to the terminal as the run begins (not
held back by pytest's capture), named in every failure message and recorded as the test's
``chaos_seed`` property (JUnit XML); ``C4_CHAOS_SEED`` replays a run with that seed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from c4.demo.chaos import SEED_ENV, TARGETS, chaos_seed
from c4.demo.run import DemoOptions, DemoRun, print_chaos, print_timeline
from tests.integration.private_stack import PrivateStack

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenario-chaos.json"


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("split", [False, True], ids=["one-stage", "split"])
def test_every_process_killed_once_during_a_live_scenario(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[[str, object], None],
    split: bool,
) -> None:
    """Split (``--split``), the streams worker killed holds the forwarder, the node stages
    and the job stage: both stages come back from their tables."""
    seed, line = chaos_seed(os.environ)
    with capsys.disabled():
        print(f"\n{line}")  # now, whatever becomes of the run (a timeout, a hang)
    print(line)  # and again with the run's output that a failure shows
    record_property("chaos_seed", seed)
    replay = f"(replay: {SEED_ENV}={seed})"
    options = DemoOptions(
        report=tmp_path / "report",
        scenario=str(SCENARIO),
        dashboard_port=None,
        chaos_seed=seed,
        settle_s=60.0,
        split=split,
    )
    with PrivateStack() as stack:
        demo = DemoRun(options, stack.settings, print)
        try:
            outcome = demo.run()
        finally:
            demo.close()
    print_timeline(outcome.timeline, print)
    print_chaos(outcome.kills, outcome.problems, print)

    assert sorted(kill.target for kill in outcome.kills) == sorted(TARGETS), replay
    assert all(kill.recovered_s is not None for kill in outcome.kills), replay
    missed = [row.truth.type for row in outcome.timeline.rows if not row.ok]
    assert not missed, f"faults not diagnosed and acted on: {missed} {replay}"
    assert not outcome.timeline.false_findings, f"{outcome.timeline.false_findings} {replay}"
    assert outcome.problems == (), f"{outcome.problems} {replay}"
