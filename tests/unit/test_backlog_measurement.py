"""A burst read before anyone measured it: the race of ``test_live_backlog[one_partition_behind]``.

A live worker judges a job's hang on the link reports it has, and waits while the link
partition of one of the job's nodes is behind (`streams.live.InputLag`). Which partitions are
behind is measured by the worker's timer. When a backlog arrives between two measurements,
the worker reads it in chunks that keep it busy and the timer waiting; read on the last
measurement, taken before the burst, every link partition is caught up. In the backlog test,
partition 2 of every topic comes last, in one burst: job-b's collectives and the link reports
of its node-003, whose cable goes down at 14 s. When the collectives came first, job-b's
stalled communicator was judged without that link_down and blamed on node-002's two ports
(the CI failure), where the replay names node-003/mlx5_1:1. The worker now measures again as
soon as a partition's records run past what the last measurement answers for (``stale``).

Here the worker's input is replayed in that worst order, without a Faust app: each record's
offset noted, measured as the worker measures (`own_progress`), then detected.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from schemas.base import C4Model
from schemas.codec import key_of
from schemas.messages import Diagnosis
from simulator import scenario_from
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from streams.core.engine import Engine
from streams.detection_app import own_progress, partition_of
from streams.live import InputLag, LiveDetection
from tests.backlog_scenario import SCENARIO

PARTITIONS = 4
KINDS = ("collective", "link", "gpu", "job")
LAGGING = partition_of("job-b", PARTITIONS)  # also node-003's link and GPU partition

Finding = tuple[str, str | None, tuple[str, ...]]


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


class Broker:
    """The partitions' logs as the worker's fetches saw them (high watermarks), and where
    each published record sits."""

    def __init__(self) -> None:
        self.highwaters: dict[TP, int] = defaultdict(int)
        self.offsets: dict[int, tuple[TP, int]] = {}

    def publish(self, messages: list[C4Model]) -> None:
        for message in messages:
            tp = tp_of(message)
            self.offsets[id(message)] = (tp, self.highwaters[tp])
            self.highwaters[tp] += 1

    def assignment(self) -> set[TP]:
        return {TP(kind, p) for kind in KINDS for p in range(PARTITIONS)}

    def highwater(self, tp: TP) -> int:
        return self.highwaters[tp]


class NoFacts:
    """The shared facts: one worker owns every partition here, nothing to learn."""

    def learn_placed_through(self, partition: int, offset: int) -> None:
        del partition, offset


def tp_of(message: C4Model) -> TP:
    kind = str(getattr(message, "kind", ""))
    topic = "collective" if kind == "collectives" else kind  # a batch rides its topic
    return TP(topic, partition_of(key_of(message), PARTITIONS))


def firing(found: list[Diagnosis]) -> set[Finding]:
    return {
        (d.class_, d.job, tuple(s.id for s in d.suspects)) for d in found if d.state == "firing"
    }


class Worker:
    """A detection worker's loop over its input: note, measure when ``stale`` (as the worker
    does, unless ``remeasure`` is off), detect; the timer measures and ticks."""

    def __init__(self, broker: Broker, remeasure: bool) -> None:
        self.broker = broker
        self.remeasure = remeasure
        self.lag = InputLag(lambda key: partition_of(key, PARTITIONS))
        self.stage = Engine(progress=self.lag)
        self.live = LiveDetection(self.stage, monotonic=lambda: 0.0)  # no silence
        self.found: list[Diagnosis] = []

    def measure(self) -> None:
        measured = own_progress(self.broker, self.lag, {k: k for k in KINDS}, NoFacts())  # type: ignore[arg-type]
        assert measured is not None
        behind, collective_parts = measured
        self.lag.update(behind, collective_parts)
        self.stage.on_progress()

    def feed(self, message: C4Model) -> None:
        tp, offset = self.broker.offsets[id(message)]
        self.lag.record(tp, offset, tp.topic, int(getattr(message, "ts_ns", 0)))
        if self.remeasure and self.lag.stale:
            self.measure()
        self.found.extend(self.live.on_message(message))

    def tick(self) -> None:
        self.measure()
        self.found.extend(self.live.on_timer())


def run_backlog(remeasure: bool) -> tuple[set[Finding], set[Finding]]:
    """What a worker concludes from the backlog test's one_partition_behind order, its
    collectives read first, and what the replay concludes."""
    scenario = scenario_from(SCENARIO)
    messages = list(simulate_cluster(build_cluster(None, scenario), scenario))
    replay = Engine()
    expected = firing([d for m in messages for d in replay.process(m)])
    broker = Broker()
    worker = Worker(broker, remeasure)
    ahead = [m for m in messages if tp_of(m).partition != LAGGING]
    behind = [m for m in messages if tp_of(m).partition == LAGGING]
    broker.publish(ahead)
    worker.tick()
    for index, message in enumerate(ahead):
        worker.feed(message)
        if index % 200 == 0:
            worker.tick()
    worker.tick()
    broker.publish(behind)  # the burst, after the timer's last measurement
    collectives_first = sorted(behind, key=lambda m: tp_of(m).topic != "collective")
    for message in collectives_first:  # a busy worker: no tick in between
        worker.feed(message)
    for _ in range(5):
        worker.tick()
    return firing(worker.found), expected


def test_a_burst_is_judged_on_a_measurement_taken_after_it_came() -> None:
    found, expected = run_backlog(remeasure=True)
    assert found == expected


def test_judged_on_the_measurement_from_before_the_burst_the_hang_blames_other_ports() -> None:
    # The race itself, and what this scenario shows of it: without the measurement the
    # burst makes due, job-b's hang is read before node-003's link_down.
    found, expected = run_backlog(remeasure=False)
    blamed = {f for f in found ^ expected if f[0] == "comm_hang"}
    assert blamed == {
        ("comm_hang", "job-b", ("node-002/mlx5_0:1", "node-002/mlx5_1:1")),
        ("comm_hang", "job-b", ("node-003/mlx5_1:1",)),
    }
