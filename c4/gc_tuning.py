"""Python's cyclic collector, run less often by the processes that allocate the most."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GEN0_THRESHOLD = 50_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """The cyclic collector run less often while detection allocates.

    Detection makes millions of small objects that die young and hold no cycles (operation
    states, tuples, decoded messages). At the default threshold (700 allocations) the
    collector runs every few messages, and its full passes walk everything the detectors
    hold: 6-8 % of a replay, 12 % of a live worker following a 4,096-rank job (its full
    passes took 0.25 s each there). What was imported before is frozen out of its scans.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
