"""An event-time clock that never goes back and says when a periodic check is due."""

from __future__ import annotations


class TickClock:
    """Event time (ns) moved forward by ``advance``; a tick is due every ``tick_ns`` of it."""

    __slots__ = ("now_ns", "tick_ns", "_next_tick_ns")

    def __init__(self, tick_ns: int) -> None:
        self.tick_ns = tick_ns
        self.now_ns = 0
        self._next_tick_ns = 0

    def advance(self, now_ns: int) -> bool:
        """Move to ``now_ns`` (never back); True when that makes a tick due."""
        if now_ns <= self.now_ns:
            return False
        self.now_ns = now_ns
        if now_ns < self._next_tick_ns:
            return False
        self._next_tick_ns = now_ns + self.tick_ns
        return True
