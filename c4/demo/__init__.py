"""``c4 demo``: the whole system on one machine, a simulated cluster with scripted faults."""

from __future__ import annotations

from c4 import C4Error


class DemoError(C4Error):
    """The demo could not start or run: a service, a file or a process failed (one line)."""
