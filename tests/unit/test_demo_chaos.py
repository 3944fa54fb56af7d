"""The chaos run's driver (kill, restart, wait for recovery) and its exactly-once audit."""

from __future__ import annotations

from typing import Any

import pytest

from c4.demo import DemoError
from c4.demo.audit import audit
from c4.demo.chaos import (
    RECOVERY_LIMIT_S,
    RESTART_AFTER_S,
    SEED_ENV,
    SEED_RANGE,
    TARGETS,
    Chaos,
    ChaosFailed,
    Target,
    chaos_seed,
    kill_plan,
    recovery_table,
)
from tests.unit.test_demo_timeline import action, finding


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeTarget:
    def __init__(self, name: str, log: list[str], back_after: int = 2) -> None:
        self.name, self.log, self.back_after = name, log, back_after
        self.checks = 0

    def kill(self) -> None:
        self.log.append(f"kill {self.name}")

    def restart(self) -> None:
        self.log.append(f"restart {self.name}")

    def back(self) -> bool:
        self.checks += 1
        return self.checks > self.back_after


def test_a_chaos_seed_comes_from_the_environment_or_is_drawn_and_says_how_to_replay() -> None:
    seed, line = chaos_seed({SEED_ENV: " 428208 "})
    assert seed == 428208
    assert line == "chaos seed 428208 (from C4_CHAOS_SEED; C4_CHAOS_SEED=428208 replays this run)"
    drawn = [chaos_seed({}) for _ in range(20)]
    assert all(0 <= seed < SEED_RANGE for seed, _ in drawn)
    assert len({seed for seed, _ in drawn}) > 1  # a fresh seed per run, not a fixed one
    seed, line = drawn[0]
    assert line == f"chaos seed {seed} (drawn for this run; C4_CHAOS_SEED={seed} replays this run)"
    assert chaos_seed({SEED_ENV: ""})[1].endswith("replays this run)")  # empty: drawn
    with pytest.raises(DemoError, match="C4_CHAOS_SEED='seven' is not an integer seed"):
        chaos_seed({SEED_ENV: "seven"})
    # The printed seed replays the run: the same kills in the same order after the same pauses.
    replayed = chaos_seed({SEED_ENV: str(seed)})[0]
    assert kill_plan(replayed, (6.0, 12.0), (2.0, 8.0)) == kill_plan(seed, (6.0, 12.0), (2.0, 8.0))


def test_the_plan_kills_every_target_once_in_a_seeded_random_order() -> None:
    first = kill_plan(7, (6.0, 12.0), (2.0, 8.0))
    assert sorted(kill.target for kill in first) == sorted(TARGETS)
    assert 6.0 <= first[0].pause_s <= 12.0
    assert all(2.0 <= kill.pause_s <= 8.0 for kill in first[1:])
    again = kill_plan(7, (6.0, 12.0), (2.0, 8.0))
    assert [(k.target, k.pause_s) for k in again] == [(k.target, k.pause_s) for k in first]
    orders = {tuple(k.target for k in kill_plan(seed, (1, 2), (1, 2))) for seed in range(30)}
    assert len(orders) > 10


def test_one_kill_at_a_time_each_waits_for_the_previous_recovery() -> None:
    clock, log = FakeClock(), list[str]()
    kills = kill_plan(3, (5.0, 5.0), (2.0, 2.0))
    targets: dict[str, Target] = {name: FakeTarget(name, log) for name in TARGETS}
    caught_up = {"now": False}
    chaos = Chaos(kills, targets, lambda since: caught_up["now"], log.append, clock)

    chaos.step()
    assert log == []  # the first pause is not over
    clock.now += 5.0
    chaos.step()
    first = kills[0].target
    assert log[-1] == f"chaos: kill -9 {first}" and chaos.holding == first
    clock.now += RESTART_AFTER_S
    chaos.step()
    assert log[-1] == f"restart {first}"
    for _ in range(5):
        clock.now += 1.0
        chaos.step()
    assert chaos.holding is None  # back: its process may be checked again
    assert kills[0].back_s is not None and kills[0].recovered_s is None
    assert not any(line.startswith("kill") for line in log[2:])  # not caught up: no next kill
    caught_up["now"] = True
    clock.now += 1.0
    chaos.step()
    assert kills[0].recovered_s == pytest.approx(clock.now - kills[0].killed_at)  # type: ignore[operator]
    clock.now += 1.0
    chaos.step()
    assert not log[-1].startswith("chaos: kill")  # the next pause (2 s) is not over yet
    for _ in range(200):
        clock.now += 0.5
        chaos.step()
    assert chaos.done
    assert [line.split()[-1] for line in log if line.startswith("chaos: kill")] == [
        kill.target.split()[-1] for kill in kills
    ]
    rows = recovery_table(kills)
    assert rows[0][0] == "kill -9" and len(rows) == len(TARGETS) + 1
    assert all(row[3] != "-" for row in rows[1:])


def test_a_process_that_does_not_come_back_fails_the_run() -> None:
    clock, log = FakeClock(), list[str]()
    kills = kill_plan(1, (1.0, 1.0), (1.0, 1.0))
    targets: dict[str, Target] = {name: FakeTarget(name, log, back_after=10**9) for name in TARGETS}
    chaos = Chaos(kills, targets, lambda since: True, log.append, clock)
    with pytest.raises(ChaosFailed, match="not back"):
        for _ in range(1000):
            clock.now += 1.0
            chaos.step()
    assert clock.now - 100.0 > RECOVERY_LIMIT_S


def test_a_target_without_a_process_is_refused_up_front() -> None:
    with pytest.raises(ChaosFailed, match="no process to kill for redis"):
        Chaos(
            kill_plan(1, (1, 2), (1, 2)),
            {n: FakeTarget(n, []) for n in TARGETS if n != "redis"},
            lambda since: True,
            print,
        )


def _snapshot(spares: list[str], jobs: dict[str, list[str]]) -> dict[str, Any]:
    return {"spares": spares, "jobs": [{"job": j, "nodes": n} for j, n in jobs.items()]}


GPU = ("gpu", "node-005/gpu5")


def test_a_clean_run_passes_the_audit() -> None:
    diagnoses = [
        finding("d1", "noncomm_slow", GPU, 3),
        finding("d1", "noncomm_slow", GPU, 9, state="resolved"),
    ]
    restart = action("d1", "restart", "job-a", replaced={"node-005": "node-000"})
    alerts = [
        action("d1", "alert", "job-a", receiver="oncall", state=state).model_copy(
            update={"id": f"alert-{state}"}
        )
        for state in ("firing", "resolved")
    ]
    # One outcome sent twice; an alert when the finding fired, another when it resolved.
    actions = [action("d1", "isolate", "node-005"), restart, restart, *alerts]
    snapshot = _snapshot(["node-001"], {"job-a": ["node-000", "node-004"]})
    assert audit(diagnoses, actions, ["node-000", "node-001"], snapshot) == []


def test_the_audit_names_what_was_done_twice_or_leaked() -> None:
    diagnoses = [finding("d1", "noncomm_slow", GPU, 3), finding("d1", "noncomm_slow", GPU, 4)]
    isolate_again = action("d2", "isolate", "node-005").model_copy(update={"id": "other"})
    twice = action("d1", "isolate", "node-005")
    actions = [twice, twice.model_copy(update={"id": "again"}), isolate_again]
    snapshot = _snapshot([], {"job-a": ["node-000"], "job-b": ["node-001"]})
    problems = audit(diagnoses, actions, ["node-000", "node-001"], snapshot)
    assert "diagnosis d1 (firing) published 2 times" in problems
    assert "isolate node-005 done 2 times for diagnosis d1" in problems
    assert "node-005 isolated 3 times" in problems
    assert any(
        p.startswith("spares taken from the pool ['node-000', 'node-001']") for p in problems
    )


def test_a_spare_placed_in_two_jobs_is_a_leak() -> None:
    restart = action("d1", "restart", "job-a", replaced={"node-005": "node-000"})
    snapshot = _snapshot([], {"job-a": ["node-000"], "job-b": ["node-000"]})
    assert audit([], [restart], ["node-000"], snapshot) == [
        "spare node-000 taken from the pool but in 2 jobs"
    ]
