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

# (global_rank, comm, ts_ns, seq, op, bytes, enter_ns, end_ns): a member's operations of one
# report, for its compute windows (`streams.core.compute.ComputeTracker.add`).
OpsRow = tuple[
    int,
    str,
    int,
    tuple[int, ...],
    tuple[str, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int | None, ...],
]
