"""Slow paths: a job's slow connections that no port explains, for the fabric correlator."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlowPath:
    """A slow connection no port explains: evidence for the fabric correlator."""

    job: str
    flow: str
    src_port: str
    dst_port: str
    via: str | None
    moved_ns: int | None = None  # when a plan last moved the flow to ``via`` (event time)
