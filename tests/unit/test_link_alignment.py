"""Live, a job's collective reports wait for its nodes' link reports (`LinkAlignment`).

A worker under load can read the link topic seconds behind the collective topic. Judged
then, a degraded port's counters look healthy: its slowdown is left to the fabric
correlator as slow paths (a false fabric finding) and the port's own finding is missed
once the job's state moved on (here: a node of the job goes down). The engine must conclude
what the replay concludes, however far behind the link reports are read.
"""

from __future__ import annotations

import zlib
from functools import cache

import pytest

from schemas.base import C4Model
from schemas.messages import Collective, Diagnosis, Job, Link, Route
from simulator.cluster import Cluster, build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import scenario_from
from streams.core.alignment import LINK_REPORTS_SLACK_NS, LinkAlignment
from streams.core.engine import Engine

NS = 1_000_000_000
DURATION_S = 30
SCENARIO = {
    "seed": 9,
    "duration_s": DURATION_S,
    "emit_routes": True,
    "fabric": {"nodes_per_leaf": 2, "spines": 2},
    "jobs": [
        {"id": f"job-{c}", "ranks": {"d": 24, "f": 24, "g": 24}.get(c, 16), "compute_ms": 120}
        for c in "abcdefg"
    ],
    "faults": [
        # node-008 (job-d) is on leaf-4a; jobs e and f cross leaf-5a~spine-a-0.
        {
            "type": "port_degraded",
            "node": "node-008",
            "port": "mlx5_2:1",
            "factor": 0.4,
            "at_s": 12,
        },
        {"type": "fabric_link_degraded", "link": "leaf-5a~spine-a-0", "factor": 0.4, "at_s": 15},
        {"type": "node_down", "node": "node-007", "at_s": 24},
    ],
}
Finding = tuple[str, str | None, tuple[str, ...]]


@cache
def recorded() -> tuple[Cluster, tuple[C4Model, ...]]:
    scenario = scenario_from(SCENARIO)
    cluster = build_cluster(None, scenario)
    return cluster, tuple(simulate_cluster(cluster, scenario))


def findings(diagnoses: list[Diagnosis]) -> set[Finding]:
    return {
        (d.class_, d.job, tuple(s.id for s in d.suspects)) for d in diagnoses if d.state == "firing"
    }


PARTITIONS = 4


def partition_of(node: str) -> int:
    return zlib.crc32(node.encode()) % PARTITIONS


class LinkTopic:
    """The link topic as a live worker sees it: a partition is behind while records of it
    are left to read."""

    def __init__(self, links: list[Link], *, always_behind: bool = False) -> None:
        self.left = [0] * PARTITIONS
        for link in links:
            self.left[partition_of(link.node)] += 1
        self.always_behind = always_behind

    def read(self, link: Link) -> None:
        self.left[partition_of(link.node)] -= 1

    def placements_pending(self) -> bool:
        return False

    def hardware_behind(self) -> bool:
        return self.always_behind or any(self.left)

    def hardware_pending(self, node: str) -> bool:
        return self.always_behind or self.left[partition_of(node)] > 0


def live_order(
    lag_ns: int, behind: int | None = None, *, always_behind: bool = False
) -> tuple[list[Diagnosis], int]:
    """The run as a live engine gets it, the link reports of partition ``behind`` (None:
    all) read ``lag_ns`` behind everything else, re-checked as the timer does after each
    record; and the most reports held at once."""
    cluster, messages = recorded()
    links = [m for m in messages if isinstance(m, Link)]
    topic = LinkTopic(links, always_behind=always_behind)
    engine = Engine(topology=cluster.topology, progress=topic)
    out: list[Diagnosis] = []
    # Each partition's links in order; those of ``behind`` come ``lag_ns`` late.
    queues = [[link for link in links if partition_of(link.node) == p] for p in range(PARTITIONS)]
    lags = [lag_ns if behind in (None, p) else 0 for p in range(PARTITIONS)]
    read = [0] * PARTITIONS
    most_held = 0
    for message in messages:
        if isinstance(message, Link):
            continue
        now = int(getattr(message, "ts_ns", 0))
        for p, queue in enumerate(queues):
            while read[p] < len(queue) and queue[read[p]].ts_ns <= now - lags[p]:
                topic.read(queue[read[p]])
                out += engine.process(queue[read[p]])
                read[p] += 1
        out += engine.process(message)
        out += engine.recheck()
        most_held = max(most_held, sum(engine.alignment.waiting.values()))
    for p, queue in enumerate(queues):
        for link in queue[read[p] :]:
            topic.read(link)
            out += engine.process(link)
    topic.always_behind = False
    out += engine.recheck()
    out += engine.check(engine.now_ns)
    return out, most_held


def replayed() -> set[Finding]:
    cluster, messages = recorded()
    engine = Engine(topology=cluster.topology)
    return findings([d for m in messages for d in engine.process(m)])


def test_the_replay_finds_the_port_the_link_and_the_node() -> None:
    assert replayed() == {
        ("link_degraded", "job-d", ("node-008/mlx5_2:1",)),
        ("comm_slow", "job-d", ("node-008/mlx5_2:1",)),
        ("link_degraded", None, ("leaf-5a~spine-a-0",)),
        ("node_down", "job-d", ("node-007",)),
    }


@pytest.mark.parametrize("lag_s", [3, 10, 20, 40])
def test_link_reports_read_behind_change_no_finding(lag_s: int) -> None:
    found, most_held = live_order(lag_s * NS)
    assert findings(found) == replayed()
    assert most_held > 0  # the reports did wait for them


@pytest.mark.parametrize("behind", range(PARTITIONS))
def test_one_link_partition_read_behind_changes_no_finding(behind: int) -> None:
    # Jobs on the other partitions' nodes wait as well: the fabric correlator joins every
    # job's slow paths at one time (held alone, one job's old paths misname the link).
    found, most_held = live_order(20 * NS, behind)
    assert findings(found) == replayed()
    assert most_held > 0  # the job's reports did wait for them


def test_link_reports_read_in_time_hold_back_little() -> None:
    found, most_held = live_order(0, always_behind=True)
    assert findings(found) == replayed()
    # Only around node-007 going down (its reports stop, its partition counts as behind),
    # until its ranks are silent (3 s): never more than 4 s of the run's reports.
    _, messages = recorded()
    per_second = sum(isinstance(m, Collective) for m in messages) / DURATION_S
    assert 0 < most_held < 4 * per_second


def test_a_replay_holds_nothing_back() -> None:
    cluster, messages = recorded()
    engine = Engine(topology=cluster.topology)
    for message in messages:
        engine.process(message)
        assert not engine.alignment.waiting


def collective(job: str, node: str, ts_ns: int, rank: int = 0) -> Collective:
    return Collective.model_validate(
        {
            "v": 1,
            "kind": "collective",
            "job": job,
            "comm": "c0",
            "comm_size": 2,
            "rank": rank,
            "global_rank": rank,
            "node": node,
            "ts_ns": ts_ns,
            "ops": {"seq": [], "op": [], "bytes": [], "enter_ns": [], "end_ns": []},
        }
    )


class Reports:
    def __init__(self) -> None:
        self.at: dict[str, int] = {}
        self.behind: set[str] = set()

    def placements_pending(self) -> bool:
        return False

    def hardware_behind(self) -> bool:
        return bool(self.behind)

    def hardware_pending(self, node: str) -> bool:
        return node in self.behind


def test_a_report_waits_only_while_its_nodes_link_reports_trail_it_and_may_come() -> None:
    reports = Reports()
    aligned = LinkAlignment(reports, reports.at.get, silent_ns=3 * NS)
    reports.at["n1"] = 10 * NS
    # Nothing behind: nothing waits, however old the link reports.
    assert not aligned.holds(collective("j", "n1", 20 * NS))
    reports.behind.add("n1")
    aligned.refresh()
    # Within the slack: goes on; past it: waits, and the next report waits behind it.
    assert not aligned.holds(collective("j", "n1", 10 * NS + LINK_REPORTS_SLACK_NS))
    late = collective("j", "n1", 13 * NS)
    assert aligned.holds(late)
    assert aligned.holds(collective("j", "n1", 11 * NS + LINK_REPORTS_SLACK_NS))
    assert list(aligned.ready()) == []
    reports.at["n1"] = 12 * NS  # the link reports caught up to 12 s
    assert [m.ts_ns for m in aligned.ready()] == [13 * NS, 13 * NS]
    assert not aligned.waiting


def test_a_node_without_link_reports_waits_only_while_its_partition_is_behind() -> None:
    reports = Reports()
    aligned = LinkAlignment(reports, reports.at.get, silent_ns=3 * NS)
    reports.behind.add("n1")
    assert aligned.holds(collective("j", "n1", 5 * NS))
    reports.behind.clear()  # read to the end: no link report of n1 can come
    aligned.refresh()
    assert [m.ts_ns for m in aligned.ready()] == [5 * NS]


def test_a_node_silent_in_the_jobs_data_is_not_waited_for() -> None:
    reports = Reports()
    aligned = LinkAlignment(reports, reports.at.get, silent_ns=3 * NS)
    reports.at.update({"n1": 10 * NS, "n2": 10 * NS})
    reports.behind.update({"n1", "n2"})
    assert not aligned.holds(collective("j", "n1", 10 * NS))
    assert not aligned.holds(collective("j", "n2", 10 * NS, rank=1))
    reports.at["n2"] = 30 * NS  # n1 went down at 10 s: neither its ranks nor its agent report
    assert aligned.holds(collective("j", "n2", 12 * NS + NS // 2, rank=1))  # n1: 10 s + slack
    assert list(aligned.ready()) == []
    aligned.holds(collective("j", "n2", 14 * NS, rank=1))  # n1 silent for 4 s of the job's data
    assert len(list(aligned.ready())) == 2


def test_held_reports_are_in_the_jobs_snapshot_and_a_fact_about_the_job_comes_after_them() -> None:
    reports = Reports()
    engine = Engine(progress=reports)
    reports.behind.add("n1")
    engine.process(collective("j", "n1", 5 * NS))
    state = engine.job_state("j")
    assert state is not None and len(state["waiting"]) == 1
    again = Engine(progress=reports)
    again.restore_job("j", state)
    assert again.alignment.held_dumps("j", lambda m: m.ts_ns) == [5 * NS]
    # The job stops: its held report is processed first, then the stop closes the job.
    again.process(
        Job.model_validate(
            {
                "v": 1,
                "kind": "job",
                "job": "j",
                "ts_ns": 6 * NS,
                "state": "stopped",
                "ranks": [],
                "comms": {},
            }
        )
    )
    assert not again.alignment.waiting
    assert "j" not in again.jobs


def test_a_route_plan_counts_from_the_latest_report_seen_held_ones_too() -> None:
    reports = Reports()
    engine = Engine(progress=reports)
    reports.behind.add("n1")
    engine.process(collective("j", "n1", 5 * NS))
    engine.process(collective("j", "n1", 9 * NS))
    assert sum(engine.alignment.waiting.values()) == 2
    plan = Route.model_validate(
        {
            "v": 1,
            "kind": "route",
            "node": "n1",
            "ts_ns": 0,
            "plan": "p-1",
            "paths": [{"flow": "j/c0/0->1", "port": "mlx5_0:1", "via": "spine-a-1"}],
        }
    )
    engine.process(plan)
    moved = plan.model_copy(
        update={"plan": "p-2", "paths": (plan.paths[0].model_copy(update={"via": "spine-a-0"}),)}
    )
    engine.process(moved)
    # Settling runs from 9 s (the reports are held), not from the clock they have not moved.
    assert engine.routes.moved_at("j/c0/0->1") == 9 * NS


def test_a_held_report_is_dumped_once_however_many_snapshots_it_waits_through() -> None:
    reports = Reports()
    aligned = LinkAlignment(reports, reports.at.get, silent_ns=3 * NS)
    reports.behind.add("n1")
    dumped: list[int] = []

    def dump(message: Collective) -> int:
        dumped.append(message.ts_ns)
        return message.ts_ns

    assert aligned.holds(collective("j", "n1", 5 * NS))
    assert aligned.held_dumps("j", dump) == [5 * NS]
    assert aligned.holds(collective("j", "n1", 6 * NS))
    assert aligned.held_dumps("j", dump) == [5 * NS, 6 * NS]
    assert dumped == [5 * NS, 6 * NS]  # the first one not dumped again
    reports.behind.clear()
    aligned.refresh()
    assert len(list(aligned.ready())) == 2
    assert aligned.held_dumps("j", dump) == [] and aligned._dumps == {}  # none kept for gone ones
