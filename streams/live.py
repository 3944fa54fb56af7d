"""The live clock around the engine: event time from the messages, advanced by wall time
while the stream is silent, so hangs and node_down fire even when nothing arrives."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from schemas.base import C4Model
from schemas.messages import Diagnosis
from streams.core.engine import Engine

NS_PER_S = 1_000_000_000


@dataclass(slots=True)
class LiveCounters:
    """What the live path took and what it dropped as too late."""

    messages: int = 0
    too_late: int = 0
    diagnoses: int = 0


class LiveDetection:
    """Feeds the engine from a live stream and ticks it from a timer.

    ``clock_rate`` is event seconds per wall second: 1 for real clusters, more for a
    simulator replaying faster than real time. Messages older than ``max_lateness_ns``
    behind the clock are counted and dropped: their operations were already judged.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        clock_rate: float = 1.0,
        max_lateness_ns: int = 30 * NS_PER_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.clock_rate = clock_rate
        self.max_lateness_ns = max_lateness_ns
        self._monotonic = monotonic
        self._latest_event_ns = 0
        self._wall_at_latest = monotonic()
        self.counters = LiveCounters()

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """One decoded message: late ones are dropped, the rest go to the engine."""
        ts_ns = int(getattr(message, "ts_ns", 0))
        if ts_ns < self.engine.now_ns - self.max_lateness_ns:
            self.counters.too_late += 1
            return []
        self.counters.messages += 1
        if ts_ns > self._latest_event_ns:
            self._latest_event_ns = ts_ns
            self._wall_at_latest = self._monotonic()
        found = self.engine.process(message)
        self.counters.diagnoses += len(found)
        return found

    def on_timer(self) -> list[Diagnosis]:
        """Advance event time by the wall time since the latest message; run due checks."""
        if self._latest_event_ns == 0:
            return []
        elapsed_s = self._monotonic() - self._wall_at_latest
        now_ns = self._latest_event_ns + int(elapsed_s * self.clock_rate * NS_PER_S)
        found = self.engine.advance(now_ns)
        self.counters.diagnoses += len(found)
        return found
