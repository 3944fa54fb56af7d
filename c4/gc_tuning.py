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


@contextmanager
def no_collections() -> Iterator[None]:
    """The cyclic collector off for a replay (``c4 diagnose`` and its node-stage workers).

    Every object detection keeps is freed by its reference count: replays of every fault
    kind, with rejected lines, leave nothing for the collector (tests/unit/test_no_cycles.py
    holds that). What the collector costs is its passes over what lives on, and that grows
    with the job: the operations pending in a group of n members are two lists of n each,
    every pass walks them, and on a heap of gigabytes each object it touches is a cache miss.
    On a 4,096-rank 3D replay the passes took 3.1 s of 15.3 s (0.4 of 3.3 s at 1,024), so
    the cost per operation grew with the job for no detection work at all. A live worker
    keeps `fewer_collections`: the event loop, Faust and the Kafka client make cycles.

    What the replay built is left frozen at the end, out of every later collection: the
    interpreter's last one, as the process exits, walked it all only to free what the
    operating system frees at once (0.8 s of a 4,096-rank replay). A caller that goes on
    (a test) keeps it until it exits; what the replay kept is what it leaves behind.
    """
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
