"""A port's snapshot row holds every field of its state, in order."""

from __future__ import annotations

from dataclasses import astuple, fields

from streams.core.hardware import PortState


def test_row_is_every_field_in_order_and_builds_the_same_state() -> None:
    state = PortState(7, 3, 5, False, 200.0, degraded=True, clean_streak=2, bad_streak=4)
    # Distinct values in every field: a field left out or swapped shows.
    assert len({repr(value) for value in state.row()}) == len(fields(PortState))
    assert state.row() == list(astuple(state))
    assert PortState(*state.row()) == state
