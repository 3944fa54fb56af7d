"""The rows a node stage hands the job stage besides operation parts and marks: plain
tuples, cheap to pickle across a process boundary (`streams.core.split`)."""

from __future__ import annotations

# (comm, comm_size, rank, global_rank, node, gpu, ts_ns): a member's latest report of a
# barrier's interval (its liveness) and where it runs (its place).
SeenRow = tuple[str, int, int, int, str | None, int | None, int]

# (comm, comm_size, rank, ts_ns, peers, ports, bytes, busy_ns): a member's connection
# samples of one report.
ConnRow = tuple[
    str, int, int, int, tuple[int, ...], tuple[str, ...], tuple[int, ...], tuple[int, ...]
]
