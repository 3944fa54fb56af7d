"""The collector thresholds the replay and the streams worker run under."""

from __future__ import annotations

import gc

import pytest

from c4.gc_tuning import GEN0_THRESHOLD, fewer_collections


def test_fewer_collections_raises_the_first_threshold_and_restores_it() -> None:
    before = gc.get_threshold()
    with fewer_collections():
        inside = gc.get_threshold()
        assert inside[0] == GEN0_THRESHOLD
        assert inside[1:] == before[1:]
        assert gc.get_freeze_count() > 0  # what was imported is out of the scans
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_fewer_collections_restores_them_when_the_body_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("stop")  # noqa: EM101 - a test's own error
    assert gc.get_threshold() == before
