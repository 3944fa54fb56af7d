"""A connection sample's flow: the rank's send, or the send that arrives at it."""

from __future__ import annotations

from streams.core.places import conn_flow


class PlannedRoutes:
    """Routes that know some flows' spines (the Routes protocol, read-only)."""

    def __init__(self, via: dict[str, str | None]) -> None:
        self._via = via

    def via(self, flow: str) -> str | None:
        return self._via.get(flow)

    def moved_at(self, flow: str) -> int | None:
        return None

    def generation(self) -> int | None:
        return 0


def test_a_sample_of_the_arriving_connection_is_the_senders_flow() -> None:
    # Ring 0 8 1 9 ...: rank 1 sends to 9 and receives from 8, reporting both as (1, peer).
    routes = PlannedRoutes({"j/c/1->9": "spine-a-0", "j/c/8->1": "spine-a-3"})
    assert conn_flow(routes, "j", "c", 1, 9) == "j/c/1->9"
    assert conn_flow(routes, "j", "c", 1, 8) == "j/c/8->1"


def test_without_a_plan_or_inside_a_leaf_the_sample_names_its_own_flow() -> None:
    assert conn_flow(PlannedRoutes({}), "j", "c", 1, 8) == "j/c/1->8"
    same_leaf = PlannedRoutes({"j/c/8->1": None})
    assert conn_flow(same_leaf, "j", "c", 1, 8) == "j/c/1->8"
    # A pair's two directions are both flows: each reported by its sender as its own.
    pair = PlannedRoutes({"j/p/0->1": "spine-a-0", "j/p/1->0": "spine-a-1"})
    assert conn_flow(pair, "j", "p", 1, 0) == "j/p/1->0"
