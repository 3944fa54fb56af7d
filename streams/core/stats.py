"""Small robust statistics over bounded windows."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import islice
from typing import Any


def median_of_sorted(ordered: list[float]) -> float:
    """The median of an already sorted, non-empty list (as `statistics.median` says it)."""
    n = len(ordered)
    half = n // 2
    if n % 2:
        return ordered[half]
    return (ordered[half - 1] + ordered[half]) / 2


def medians_of_others(values: list[float]) -> list[float]:
    """For each value, the median of all the others (as `statistics.median` says it), from
    one sort: O(n log n) for n values, not a sort of n - 1 values for each of them."""
    n = len(values)
    if n < 2:
        return []
    order = sorted(range(n), key=values.__getitem__)
    ordered = [values[i] for i in order]
    rest = n - 1  # how many values each median is of
    half = rest // 2
    out = [0.0] * n
    for position, index in enumerate(order):
        # The k-th of the others is the k-th of all below this value's place, the next after.
        upper = ordered[half + 1] if half >= position else ordered[half]
        if rest % 2:
            out[index] = upper
        else:
            lower = ordered[half] if half - 1 >= position else ordered[half - 1]
            out[index] = (lower + upper) / 2
    return out


def median_of(values: Iterable[float]) -> float:
    """The median of non-empty values (as `statistics.median` says it, without its checks)."""
    return median_of_sorted(sorted(values))


class Window:
    """The last ``size`` samples and their median."""

    __slots__ = ("_samples", "_median")

    def __init__(self, size: int) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        # The median as of the last read, None when a sample came since: read once a check
        # per communicator, while samples come once per completed operation.
        self._median: float | None = None

    def add(self, sample: float) -> None:
        """Append a sample, dropping the oldest past the window's size."""
        self._samples.append(sample)
        self._median = None

    def __len__(self) -> int:
        return len(self._samples)

    def median(self) -> float | None:
        """The median of the window, None while empty."""
        if self._median is None and self._samples:
            self._median = median_of_sorted(sorted(self._samples))
        return self._median

    def state(self) -> list[float]:
        """The samples, oldest first (for a snapshot)."""
        return list(self._samples)

    def restore(self, samples: list[float]) -> None:
        """Put back the samples of a snapshot."""
        self._samples.clear()
        self._samples.extend(samples)
        self._median = None


class Baseline:
    """A hopping baseline: median of older samples vs median of the recent ones.

    While a slowdown is open the baseline is frozen, so the slow samples never become
    the new normal and the finding resolves only when the operations are fast again.
    """

    __slots__ = ("_history", "_recent", "_frozen")

    def __init__(self, baseline_size: int, recent_size: int) -> None:
        self._history: deque[float] = deque(maxlen=baseline_size + recent_size)
        self._recent = recent_size
        self._frozen: float | None = None

    def add(self, value: float) -> None:
        """Record one sample."""
        self._history.append(value)

    def ready(self) -> bool:
        """Whether enough samples exist to compare recent against baseline."""
        return len(self._history) == self._history.maxlen

    def baseline(self) -> float:
        """The reference value (frozen while a slowdown is open)."""
        if self._frozen is not None:
            return self._frozen
        history = self._history
        return median_of_sorted(sorted(islice(history, 0, len(history) - self._recent)))

    def low(self) -> float:
        """A lower bound of ``baseline()``, cheaper than it: the frozen reference, or the
        smallest sample of the baseline part."""
        if self._frozen is not None:
            return self._frozen
        history = self._history
        return min(islice(history, 0, len(history) - self._recent))

    def recent(self) -> float:
        """The median of the most recent samples."""
        history = self._history
        start = max(0, len(history) - self._recent)
        return median_of_sorted(sorted(islice(history, start, None)))

    def freeze(self) -> None:
        """Keep the current baseline until `thaw`."""
        if self._frozen is None:
            self._frozen = self.baseline()

    def thaw(self) -> None:
        """Let the baseline follow the samples again."""
        self._frozen = None

    def state(self) -> dict[str, Any]:
        """The samples and the frozen reference (for a snapshot)."""
        return {"history": list(self._history), "frozen": self._frozen}

    def restore(self, state: dict[str, Any]) -> None:
        """Put back a snapshot's samples and frozen reference."""
        self._history.clear()
        self._history.extend(state["history"])
        self._frozen = state["frozen"]
