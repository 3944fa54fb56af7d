"""``c4 demo``: the whole system on one machine, a simulated cluster with scripted faults."""

from __future__ import annotations

from collections.abc import Callable

from c4 import C4Error

# How the demo's modules report progress: one line at a time, to the terminal or a test.
Say = Callable[[str], None]


class DemoError(C4Error):
    """The demo could not start or run: a service, a file or a process failed (one line)."""
