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
    # Only the events up to 2 s after the hang began: then the stream is silent.
    hang_start = T0 + 40 * (job.compute_ns + job.transfer_ns)
    found = []
    for message in [job.job_message(), *job.messages()]:
        if message.ts_ns > hang_start + 2 * S:
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
        if message.ts_ns > hang_start + 2 * S:
            break
        live.on_message(message)
    clock.now += 2.0  # one wall second past the grace: ten event seconds at rate 10
    assert [d.class_ for d in live.on_timer()] == ["noncomm_hang"]


def test_messages_beyond_lateness_are_counted_and_dropped() -> None:
    live = LiveDetection(Engine(), max_lateness_ns=5 * S)
    messages = RingJob(ops=80).messages()
    latest = messages[-1]
    live.on_message(latest)
    live.on_message(messages[0])  # far older than 5 s behind the clock
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
