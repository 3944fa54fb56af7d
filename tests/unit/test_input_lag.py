"""`InputLag`: what a live worker counts as possibly still to come."""

from __future__ import annotations

from dataclasses import dataclass

from streams.live import NS_PER_S, InputLag


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def caught_up(lag: InputLag, collective_parts: set[int]) -> None:
    lag.update({"job": set(), "collective": set(), "link": set()}, collective_parts)


def test_unmeasured_job_topic_counts_as_behind() -> None:
    lag = InputLag(lambda key: 0)
    assert lag.placements_pending()
    lag.update({"job": {1}})
    assert lag.placements_pending()
    lag.update({"job": set()})
    assert not lag.placements_pending()


def test_a_collective_partition_behind_in_event_time_is_waited_on_for_idle_s() -> None:
    clock = Clock()
    lag = InputLag(lambda key: 0, lag_slack_ns=5 * NS_PER_S, idle_s=15.0, monotonic=clock)
    caught_up(lag, {0, 1})
    lag.record(TP("c", 0), 0, "collective", 30 * NS_PER_S)
    lag.record(TP("c", 1), 0, "collective", 12 * NS_PER_S)  # 18 s behind partition 0
    assert lag.placements_pending()  # the wait starts at this first question
    clock.now += 14.0
    assert lag.placements_pending()
    clock.now += 1.0
    assert not lag.placements_pending()  # waited idle_s: the partition holds nothing more
    # Once it catches up, a later lag starts a wait of its own.
    lag.record(TP("c", 1), 1, "collective", 30 * NS_PER_S)
    assert not lag.placements_pending()
    lag.record(TP("c", 0), 1, "collective", 60 * NS_PER_S)
    assert lag.placements_pending()


def test_partitions_within_the_slack_or_not_read_here_do_not_wait() -> None:
    clock = Clock()
    lag = InputLag(lambda key: 0, lag_slack_ns=5 * NS_PER_S, monotonic=clock)
    caught_up(lag, {0, 1})
    lag.record(TP("c", 0), 0, "collective", 30 * NS_PER_S)
    lag.record(TP("c", 1), 0, "collective", 26 * NS_PER_S)
    lag.record(TP("c", 7), 0, "collective", 1 * NS_PER_S)  # not assigned here (any more)
    assert not lag.placements_pending()
    # A link report ahead of every job's collectives makes them lag.
    lag.record(TP("l", 3), 0, "link", 40 * NS_PER_S)
    assert lag.placements_pending()


def test_an_empty_collective_partition_costs_one_wait_not_one_per_finding() -> None:
    clock = Clock()
    lag = InputLag(lambda key: 0, idle_s=15.0, monotonic=clock)
    caught_up(lag, {0, 1})  # partition 1 never holds a record
    lag.record(TP("c", 0), 0, "collective", 30 * NS_PER_S)
    assert lag.placements_pending()
    clock.now += 15.0
    assert not lag.placements_pending()
    lag.record(TP("c", 0), 1, "collective", 90 * NS_PER_S)
    assert not lag.placements_pending()
    lag.reset()  # a rebalance: measured afresh, waited on afresh
    caught_up(lag, {0, 1})
    assert lag.placements_pending()


def test_a_measurement_answers_only_for_what_was_processed_when_it_was_taken() -> None:
    lag = InputLag(lambda key: 0, remeasure_ns=NS_PER_S)
    assert lag.stale  # nothing measured yet
    lag.record(TP("c", 0), 0, "collective", 30 * NS_PER_S)
    caught_up(lag, {0, 1})
    assert not lag.stale
    # Within a second of event time past what it covered: it still answers.
    lag.record(TP("c", 0), 1, "collective", 30 * NS_PER_S + NS_PER_S // 2)
    lag.record(TP("c", 0), 2, "collective", 31 * NS_PER_S)
    assert not lag.stale
    # Records past that, or on a partition that held nothing then (a burst), make it stale.
    lag.record(TP("c", 0), 3, "collective", 31 * NS_PER_S + 1)
    assert lag.stale
    caught_up(lag, {0, 1})
    lag.record(TP("l", 2), 0, "link", 5 * NS_PER_S)  # far behind the others, yet new here
    assert lag.stale
    caught_up(lag, {0, 1})
    lag.record(TP("j", 2), 0, "job", 99 * NS_PER_S)  # a fact, not data: no event time
    lag.record(TP("c", 0), 4, "collective", 20 * NS_PER_S)  # older than what was covered
    assert not lag.stale
    lag.reset()  # a rebalance
    assert lag.stale
