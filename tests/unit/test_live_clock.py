from __future__ import annotations

from streams.core.engine import Engine
from streams.live import LiveDetection
from tests.unit.ring_job import T0, RingJob, S


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_timer_advances_event_time_when_the_stream_goes_silent() -> None:
    clock = FakeClock()
    live = LiveDetection(Engine(), monotonic=clock)
    job = RingJob(stuck_rank={11: 40})
    # The events up to 3.5 s after the hang began (the waiting ranks' reports show it), then
    # the stream is silent: the timer must conclude without another message.
    hang_start = T0 + 40 * (job.compute_ns + job.transfer_ns)
    found = []
    for message in [job.job_message(), *job.messages()]:
        if message.ts_ns > hang_start + 3.5 * S:
            break
        found.extend(live.on_message(message))
    assert found == []
    clock.now += 2.0
    assert live.on_timer() == []
    clock.now += 8.0
    fired = live.on_timer()
    assert [d.class_ for d in fired] == ["noncomm_hang"]


def test_clock_rate_scales_silent_time() -> None:
    clock = FakeClock()
    live = LiveDetection(Engine(), clock_rate=10.0, monotonic=clock)
    job = RingJob(stuck_rank={11: 40})
    hang_start = T0 + 40 * (job.compute_ns + job.transfer_ns)
    for message in [job.job_message(), *job.messages()]:
        if message.ts_ns > hang_start + 3.5 * S:
            break
        live.on_message(message)
    clock.now += 2.0  # one wall second past the grace: ten event seconds at rate 10
    assert [d.class_ for d in live.on_timer()] == ["noncomm_hang"]


def test_a_silent_stream_alone_concludes_nothing() -> None:
    # The data stops (a broker outage, the end of a run) with operations in flight: however
    # long the timer runs, no hang and no node_down comes of silence alone.
    clock = FakeClock()
    engine = Engine()
    live = LiveDetection(engine, monotonic=clock)
    job = RingJob(ops=60)
    messages = job.messages()
    cut = len(messages) // 2 + 3  # some ranks reported the latest op, the others not yet
    for message in [job.job_message(), *messages[:cut]]:
        assert live.on_message(message) == []
    tracker = engine.jobs["job-1"].comms["c0"]
    assert any(0 < state.entered < tracker.size for state in tracker.pending.values())
    for _ in range(20):
        clock.now += 30.0
        assert live.on_timer() == []
    assert engine.now_ns > messages[cut].ts_ns + 60 * S


def test_messages_beyond_lateness_are_counted_and_dropped() -> None:
    live = LiveDetection(Engine(), max_lateness_ns=5 * S)
    messages = RingJob(ops=80).messages()
    latest = messages[-1]
    live.on_message(latest)
    first = next(m for m in messages if m.node == latest.node)
    live.on_message(first)  # far older than 5 s behind its node's latest report
    assert live.counters.too_late == 1
    assert live.counters.messages == 1


def test_metrics_count_messages_late_drops_and_diagnoses() -> None:
    live = LiveDetection(Engine(), max_lateness_ns=5 * S)
    job = RingJob(stuck_rank={11: 40})
    for message in [job.job_message(), *job.messages()]:
        live.on_message(message)
    live.on_message(job.messages()[0])  # far behind the clock now
    registry = live.metrics.registry
    assert registry.get_sample_value("c4_stream_messages_total", {"kind": "collective"}) == len(
        job.messages()
    )
    assert registry.get_sample_value("c4_stream_late_dropped_total") == 1
    assert (
        registry.get_sample_value(
            "c4_stream_diagnoses_total", {"class": "noncomm_hang", "state": "firing"}
        )
        == 1
    )
    assert registry.get_sample_value("c4_stream_tracked_jobs") == 1


def test_placements_and_routes_stamped_on_another_clock_never_move_event_time() -> None:
    # An action worker publishes a new placement stamped with its wall clock, far ahead of
    # (or behind) the data: it is taken, and the data after it is neither late nor judged
    # against that stamp.
    engine = Engine()
    live = LiveDetection(engine, max_lateness_ns=5 * S)
    job = RingJob(ops=80)
    messages = job.messages()
    half = len(messages) // 2
    for message in messages[:half]:
        live.on_message(message)
    clock_before = engine.now_ns
    ahead = job.job_message().model_copy(update={"ts_ns": clock_before + 3600 * S})
    behind = job.job_message().model_copy(update={"ts_ns": 1})
    assert live.on_message(ahead) == [] and live.on_message(behind) == []
    assert engine.now_ns == clock_before
    for message in messages[half:]:
        live.on_message(message)
    assert live.counters.too_late == 0
    assert live.counters.messages == len(messages) + 2


def test_a_job_behind_the_clock_is_not_late_only_out_of_order_in_itself() -> None:
    # Job-2's partition lags a minute behind job-1's (an overloaded worker, a replayed
    # spool): its reports are behind the worker's clock but in order for the job, so they
    # are all taken and its straggler is still found. A report older than the bound behind
    # its own job's latest is late.
    live = LiveDetection(Engine(), max_lateness_ns=5 * S)
    ahead = RingJob(job="job-1", ops=80)
    behind = RingJob(job="job-2", first_node=2, ops=120, slow_rank={5: (20, 1.3)}, seed=3)
    for message in [ahead.job_message(), *ahead.messages()]:
        live.on_message(message)
    shift = -60 * S
    lagging = [m.model_copy(update={"ts_ns": m.ts_ns + shift}) for m in behind.messages()]
    found = [d for m in [behind.job_message(), *lagging] for d in live.on_message(m)]
    assert live.counters.too_late == 0
    assert [(d.class_, d.job) for d in found if d.state == "firing"] == [("noncomm_slow", "job-2")]
    live.on_message(lagging[0])  # now far older than job-2's latest report
    assert live.counters.too_late == 1


def test_a_record_is_taken_as_its_messages_one_by_one() -> None:
    messages = RingJob(stuck_rank={11: 40}).messages()
    one_by_one = LiveDetection(Engine(), max_lateness_ns=5 * S, monotonic=FakeClock())
    by_record = LiveDetection(Engine(), max_lateness_ns=5 * S, monotonic=FakeClock())
    late = messages[0]
    found = [d for m in [*messages, late] for d in one_by_one.on_message(m)]
    taken = [by_record.on_record(messages[i : i + 7]) for i in range(0, len(messages), 7)]
    taken.append(by_record.on_record([late]))
    assert [d for t in taken for d in t.found] == found and found
    assert all(t.failed == [] for t in taken)
    assert by_record.counters == one_by_one.counters
    assert by_record.counters.too_late == 1

    def samples(live: LiveDetection, name: str) -> dict[str, float]:
        return {
            f"{s.name}{sorted(s.labels.items())}": s.value
            for metric in live.metrics.registry.collect()
            if metric.name == name
            for s in metric.samples
            if not s.name.endswith("_created")
        }

    for name in ("c4_stream_messages", "c4_stream_operations", "c4_stream_late_dropped"):
        assert samples(by_record, name) == samples(one_by_one, name)
    per_record = samples(by_record, "c4_stream_processing_seconds")
    assert per_record["c4_stream_processing_seconds_count[]"] == len(taken)


class FailingOn:
    """A stage that fails on one message and takes the others."""

    def __init__(self, stage: Engine, bad_ts_ns: int) -> None:
        self.stage, self.bad_ts_ns, self.taken = stage, bad_ts_ns, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.stage, name)

    def on_message(self, message: object) -> list[object]:
        if getattr(message, "ts_ns", 0) == self.bad_ts_ns:
            msg = "broken"
            raise ValueError(msg)
        self.taken += 1
        return []


def test_a_message_the_stage_fails_on_is_given_back_and_the_rest_go_on() -> None:
    messages = RingJob(ops=4).messages()[:5]
    stage = FailingOn(Engine(), messages[2].ts_ns)
    live = LiveDetection(stage, monotonic=FakeClock())  # type: ignore[arg-type]
    taken = live.on_record(messages)
    assert [(index, str(error)) for index, error in taken.failed] == [
        (i, "broken") for i, m in enumerate(messages) if m.ts_ns == messages[2].ts_ns
    ]
    assert stage.taken == len(messages) - len(taken.failed)
