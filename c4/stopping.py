"""How a long-running command is told to stop: SIGTERM or SIGINT sets an Event.

Each command waits on (or polls) the Event and then shuts down in order: it drains, closes
and exits 0, the same on ``kill`` as on Ctrl-C. The handlers are the command's while it
runs and the previous ones again after.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An Event set by SIGTERM or SIGINT while the block runs (main thread only)."""
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    previous = {signum: signal.signal(signum, _stop) for signum in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: not installed from Python; nothing to put back
                signal.signal(signum, handler)
