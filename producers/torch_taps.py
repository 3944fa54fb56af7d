"""torch.distributed operations recorded in C++: c10d pre/post hooks that never take the GIL.

c10d releases the GIL around every operation, so a Python pre- or post-hook takes it back
on each call, and a Python callback on gloo's future takes it on gloo's thread before the
waiting training thread is woken (11 to 35 µs per operation here, ``bench/bench_agent.py``).
The helper in ``torch_taps.cpp`` registers its own hooks on a process group (a *tap*): they
record op, root, bytes and enter time, and take the end time with a callback on the
Work's future (gloo) or a thread asking ``Work::isCompleted()`` (NCCL: the CUDA events),
all in C++. The batching thread drains each tap once per interval.

The helper is compiled on first use with ``torch.utils.cpp_extension`` (g++ and ninja, about
15 s) and cached under ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``); the
ranks of one node share one build. ``python -m producers.torch_taps`` builds it ahead of time,
for instance in a node image. Where it cannot be built the instrumentation says why, once,
and records in Python instead.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from producers import ProducerError

SOURCE = __file__.removesuffix(".py") + ".cpp"
MODULE_NAME = "c4_torch_taps_v1"  # a new name for a changed interface; a changed source rebuilds

# One operation a tap drained: (id, c10d HookOpName value, root, bytes, enter_ns, end_ns or 0)
Entered = tuple[int, int, int, int, int, int]


class NativeUnavailable(ProducerError):
    """The C++ hooks cannot be built or loaded on this machine."""


class Tap(Protocol):
    """One process group's C++ hooks (``torch_taps.cpp``)."""

    def drain(self) -> tuple[list[Entered], list[tuple[int, int]], int]:
        """(ops entered since the last drain, in order; (id, end_ns) of ops drained while
        running that ended since; hook errors so far)."""

    def end_blind(self, now_ns: int) -> None:
        """End now the ops whose Work has no future and that wait for a next op (at close)."""


@dataclass(frozen=True, slots=True)
class NativeHooks:
    """The compiled helper's calls."""

    # (group, hook id, HookOpName values to record, poll instead of the future) -> its Tap
    tap_group: Callable[[Any, int, Sequence[int], bool], Tap]
    set_poll_period_us: Callable[[int], None]
    settle_polling: Callable[[int], None]  # wait (µs at most) for the poller's next full pass


_LOADED: dict[str, NativeHooks] = {}
_LOADING = threading.Lock()


def load_native() -> NativeHooks:
    """The helper, built if needed (once per machine and torch version); raises
    `NativeUnavailable` with the reason in one line."""
    with _LOADING:
        if "native" in _LOADED:
            return _LOADED["native"]
        try:
            from torch.utils import cpp_extension

            module = cpp_extension.load(
                name=MODULE_NAME,
                sources=[SOURCE],
                extra_cflags=["-O2"],
                with_cuda=False,
                verbose=False,
            )
        except Exception as error:  # noqa: BLE001 -- compiler, ninja, headers: any reason
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            reason = lines[0] if lines else type(error).__name__
            message = f"cannot build the C++ hooks ({type(error).__name__}: {reason})"
            raise NativeUnavailable(message) from error
        native = NativeHooks(module.tap_group, module.set_poll_period_us, module.settle_polling)
        atexit.register(module.stop_polling)  # no thread asking Works while torch shuts down
        _LOADED["native"] = native
        return native


def main() -> int:
    """Build the helper now (``python -m producers.torch_taps``)."""
    started = time.monotonic()
    try:
        load_native()
    except NativeUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"c4 torch C++ hooks ready ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
