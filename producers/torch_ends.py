"""End times of torch.distributed operations taken in C++, without the GIL.

gloo completes a Work's future on its own thread, and it does so *before* it wakes the
training thread waiting in ``wait()``. A Python callback on that future must take the GIL
first, so every operation pays a GIL round trip on its critical path (11 to 35 µs here,
``bench/bench_agent.py``). A Python thread polling NCCL's Works takes the GIL a thousand
times a second, and the training thread waits for it. The helper in ``torch_ends.cpp`` does
both in C++ (a callback on the future; a thread asking ``Work::isCompleted()``, asleep while
nothing runs): each writes the time into a table cell, and the batching thread reads the
table once per interval.

The helper is compiled on first use with ``torch.utils.cpp_extension`` (g++ and ninja, about
15 s) and cached under ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``); the
ranks of one node share one build. ``python -m producers.torch_ends`` builds it ahead of time,
for instance in a node image. Where it cannot be built the instrumentation says why, once,
and takes end times in Python instead.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers import ProducerError

SOURCE = Path(__file__).with_name("torch_ends.cpp")
MODULE_NAME = "c4_torch_ends_v2"  # a new name for a changed interface; a changed source rebuilds


class StamperUnavailable(ProducerError):
    """The C++ end-time helper cannot be built or loaded on this machine."""


@dataclass(frozen=True, slots=True)
class EndStamper:
    """The compiled helper's calls."""

    stamp_on_end: Callable[[Any], int]  # Work -> slot its end goes to, -1 without a future
    poll_on_end: Callable[[Any], int]  # Work -> slot its end goes to once polled completed
    set_poll_period_us: Callable[[int], None]
    ends_of: Callable[[Sequence[int]], list[int]]  # per slot: end ns, 0 running, -1 reused


_LOADED: dict[str, EndStamper] = {}
_LOADING = threading.Lock()


def load_stamper() -> EndStamper:
    """The helper, built if needed (once per machine and torch version); raises
    `StamperUnavailable` with the reason in one line."""
    with _LOADING:
        if "stamper" in _LOADED:
            return _LOADED["stamper"]
        try:
            from torch.utils import cpp_extension

            module = cpp_extension.load(
                name=MODULE_NAME,
                sources=[str(SOURCE)],
                extra_cflags=["-O2"],
                with_cuda=False,
                verbose=False,
            )
        except Exception as error:  # noqa: BLE001 -- compiler, ninja, headers: any reason
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            reason = lines[0] if lines else type(error).__name__
            message = f"cannot build the C++ end-time helper ({type(error).__name__}: {reason})"
            raise StamperUnavailable(message) from error
        stamper = EndStamper(
            module.stamp_on_end,
            module.poll_on_end,
            module.set_poll_period_us,
            module.ends_of,
        )
        atexit.register(module.stop_polling)  # no thread asking Works while torch shuts down
        _LOADED["stamper"] = stamper
        return stamper


def main() -> int:
    """Build the helper now (``python -m producers.torch_ends``)."""
    started = time.monotonic()
    try:
        load_stamper()
    except StamperUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"c4 torch end-time helper ready ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
