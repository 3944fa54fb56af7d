"""Progress bars on stderr for the long offline commands (``c4 diagnose``, ``c4 simulate``).

Shown only while stderr is a terminal, that is while a person watches: piped or redirected,
stderr gets exactly the lines it got before and the work runs unwrapped (no bar, no cost).
A bar is gone when its work ends (tqdm's ``leave=False``): the command's closing line stands
alone, as without one. Lines written meanwhile to the same terminal (rejected input lines,
diagnoses on stdout) are printed above the bar, not through it.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, NoReturn, Self, TypeVar, cast

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from tqdm import tqdm

CHUNK_BYTES = 1 << 16
EVENT_STEPS = 500  # event-time bar updates per run: often enough to move, seldom enough to cost
BAR_FORMAT_EVENT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of event time [{elapsed}<{remaining}]"
)
_UNTOUCHED: AbstractContextManager[None] = nullcontext()
_T = TypeVar("_T")


def on_terminal(stream: IO[Any]) -> bool:
    """Whether ``stream`` is a terminal (a closed or detached one is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class ReadProgress:
    """A bar of the bytes read from ``source`` on ``terminal``, while ``terminal`` is one.

    Read the input through ``source`` (``source`` itself without a bar), write messages
    through ``messages``, and write other output to the terminal inside ``above(stream)``.
    A source that is itself a terminal (someone typing) gets no bar.
    """

    def __init__(self, source: IO[bytes], description: str, terminal: IO[str]) -> None:
        self.source: IO[bytes] = source
        self.messages: IO[str] = terminal
        self._terminal = terminal
        self._bar: tqdm[NoReturn] | None = None
        if on_terminal(terminal) and not on_terminal(source):
            from tqdm import tqdm  # only on a terminal: every command's start-up skips it

            self._bar = bar = tqdm(
                total=_file_size(source),
                desc=description,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=terminal,
                leave=False,
                dynamic_ncols=True,
            )
            counted = _CountedReader(source, bar.update)
            self.source = io.BufferedReader(counted, CHUNK_BYTES)
            # A text stream at run time; typeshed has no io class that is IO[str] but the
            # wrappers of a buffer.
            self.messages = cast(IO[str], _AboveBar(terminal))

    @property
    def shown(self) -> bool:
        """Whether a bar is shown."""
        return self._bar is not None

    def above(self, stream: IO[Any]) -> AbstractContextManager[None]:
        """Around a write to ``stream``: while the bar is shown and ``stream`` is a
        terminal too, the bar steps aside and the write is flushed before it comes back."""
        if self._bar is None or not on_terminal(stream):
            return _UNTOUCHED
        return _flushed_above(self._terminal, stream)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self.source.close()  # the counting reader only: the input is the caller's
            self._bar.close()


def event_progress(
    messages: Iterator[_T],
    event_ns: Callable[[_T], int],
    start_ns: int,
    duration_s: float,
    description: str,
    terminal: IO[str],
) -> Iterator[_T]:
    """``messages`` as they are while ``terminal`` is no terminal; on one, the same messages
    moving a bar by the event time they reached (``event_ns`` of each), in seconds of the
    run's ``duration_s`` from ``start_ns``."""
    if not on_terminal(terminal):
        return messages
    return _timed(messages, event_ns, start_ns, duration_s, description, terminal)


def _timed(
    messages: Iterator[_T],
    event_ns: Callable[[_T], int],
    start_ns: int,
    duration_s: float,
    description: str,
    terminal: IO[str],
) -> Iterator[_T]:
    from tqdm import tqdm  # only on a terminal: every command's start-up skips it

    step_ns = max(1, int(duration_s * 1e9 / EVENT_STEPS))
    mark_ns = start_ns + step_ns
    with tqdm(
        total=duration_s,
        desc=description,
        file=terminal,
        leave=False,
        dynamic_ncols=True,
        bar_format=BAR_FORMAT_EVENT,
    ) as bar:
        for message in messages:
            at_ns = event_ns(message)
            if at_ns >= mark_ns:
                bar.update(min(duration_s, (at_ns - start_ns) / 1e9) - bar.n)
                mark_ns = at_ns + step_ns
            yield message


def _file_size(source: IO[bytes]) -> int | None:
    """The bytes left in ``source`` when it is a regular file (None: a pipe, unknown)."""
    try:
        status = os.fstat(source.fileno())
        position = source.tell()
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(status.st_mode):
        return None
    return max(0, status.st_size - position)


class _CountedReader(io.RawIOBase):
    """``source`` read as it is, each chunk's size told to ``advance``."""

    def __init__(self, source: IO[bytes], advance: Callable[[int], object]) -> None:
        super().__init__()
        self._read = getattr(source, "read1", source.read)
        self._advance = advance

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        view = memoryview(buffer).cast("B")
        data = self._read(len(view))
        view[: len(data)] = data
        self._advance(len(data))
        return len(data)


class _AboveBar(io.TextIOBase):
    """Text written to ``terminal`` above its bars."""

    def __init__(self, terminal: IO[str]) -> None:
        super().__init__()
        self._terminal = terminal

    def writable(self) -> bool:
        return True

    def write(self, text: str, /) -> int:
        from tqdm import tqdm  # imported already: a bar made this writer

        tqdm.write(text, file=self._terminal, end="")
        return len(text)


@contextmanager
def _flushed_above(terminal: IO[str], stream: IO[Any]) -> Iterator[None]:
    from tqdm import tqdm  # imported already: only a bar's output comes here

    with tqdm.external_write_mode(file=terminal):
        yield
        stream.flush()
