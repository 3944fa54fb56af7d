"""kill -9 of every process of the system, one at a time, at random moments of a live run.

The whole system runs as `c4 demo --chaos` does, on a Kafka and a Redis of this test's own:
the streams worker, the actions worker and a node agent as processes, the simulated
cluster handing its records to the agent, six scripted faults. Each of the five processes
(streams worker, actions worker, node agent, Kafka, Redis) is killed with SIGKILL once, in
a random order after a random pause, and started again; the next kill waits until the
pipeline has caught up. At the end every fault must be diagnosed and acted on, nothing
raised falsely, and the audit must find nothing done twice: no diagnosis (id, state)
published twice, no action done twice, no node isolated twice, every spare taken placed in
exactly one job. The seed is random per run (printed; ``C4_CHAOS_SEED`` repeats one).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from c4.demo.chaos import TARGETS
from c4.demo.run import DemoOptions, DemoRun, print_chaos, print_timeline
from tests.integration.private_stack import PrivateStack

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenario-chaos.json"


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_every_process_killed_once_during_a_live_scenario(tmp_path: Path) -> None:
    seed = int(os.environ.get("C4_CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
    print(f"chaos seed {seed} (C4_CHAOS_SEED={seed} repeats this order and these pauses)")
    options = DemoOptions(
        report=tmp_path / "report",
        scenario=str(SCENARIO),
        dashboard_port=None,
        chaos_seed=seed,
        settle_s=60.0,
    )
    with PrivateStack() as stack:
        demo = DemoRun(options, stack.settings, print)
        try:
            outcome = demo.run()
        finally:
            demo.close()
    print_timeline(outcome.timeline, print)
    print_chaos(outcome.kills, outcome.problems, print)

    assert sorted(kill.target for kill in outcome.kills) == sorted(TARGETS)
    assert all(kill.recovered_s is not None for kill in outcome.kills)
    missed = [row.truth.type for row in outcome.timeline.rows if not row.ok]
    assert not missed, f"faults not diagnosed and acted on: {missed}"
    assert not outcome.timeline.false_findings, outcome.timeline.false_findings
    assert outcome.problems == (), outcome.problems
