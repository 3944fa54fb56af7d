"""Slow paths: a job's slow connections that no port explains, for the fabric correlator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SlowPath:
    """A slow connection no port explains: evidence for the fabric correlator."""

    job: str
    flow: str
    src_port: str
    dst_port: str
    via: str | None
    moved_ns: int | None = None  # when a plan last moved the flow to ``via`` (event time)
    # Its throughput now over its own reference on this path (how far it fell: a dark link
    # leaves a crawl, a degraded one a share); None where not known (treated as degraded).
    fell_to: float | None = None


def fall_ratio(now: float, reference: float) -> float | None:
    """``now`` over ``reference``, to two decimals (paths are re-sent to the fabric hub
    when they change: no churn below that); None without a reference."""
    return round(now / reference, 2) if reference > 0 else None


def path_row(path: SlowPath) -> list[str | int | float | None]:
    """A slow path of a known job as plain data (a hub report's row, a snapshot's)."""
    return [path.flow, path.src_port, path.dst_port, path.via, path.moved_ns, path.fell_to]


def path_of(job: str, row: list[Any]) -> SlowPath:
    """The inverse of `path_row`; a row of five fields (written before paths said how far
    they fell) leaves that unknown. `ValueError` for a row of any other length."""
    if len(row) not in (5, 6):
        message = f"a slow path row has 5 or 6 fields, got {len(row)}"
        raise ValueError(message)
    flow, src, dst, via, moved, *fell = row
    fell_to = float(fell[0]) if fell and fell[0] is not None else None
    return SlowPath(job, flow, src, dst, via, moved, fell_to)
