"""What a communicator's members spread over shards cost each side (issue 34).

The collective reports of a recorded job (default: the replay benchmark's data-parallel
shape, one group over every rank) go through each communicator two ways, in the same run:

- baseline: one `CommTracker` takes every member's report (what one job stage does today);
- shards: the members' nodes split over S shards (`ShardComm`, the node stage), each
  completed part merged by the job stage (`SeqMerge`).

Reported per way: the job stage's time per operation (what cannot be spread), the node
stage's (spread over S workers: the busiest shard), per-report latency percentiles of the
node stage and the peak memory of the state (tracemalloc, a separate untimed pass). Both
ways learn the same (checked at the end of each run: spans, baselines, sync points).
Decoding is not timed: it is the node stage's either way.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schemas.messages import Collective, Collectives  # noqa: E402
from schemas.records import Rejected, decode_record  # noqa: E402
from streams.core import native  # noqa: E402
from streams.core.comm import CommTracker  # noqa: E402
from streams.core.params import DetectorParams  # noqa: E402
from streams.core.shard import SeqMerge, ShardComm  # noqa: E402

SYNC_EVERY_NS = 500_000_000


@dataclass
class Run:
    name: str
    node_s: float  # the busiest shard (all of it for the baseline)
    node_total_s: float
    job_s: float
    per_report_us: list[float]
    peak_mib: float = 0.0


def load(path: Path) -> list[Collective]:
    reports: list[Collective] = []
    with path.open("rb") as lines:
        for line in lines:
            for result in decode_record(line.strip()):
                if isinstance(result, Rejected):
                    continue
                if isinstance(result, Collectives):
                    reports.extend(result.messages)
                elif isinstance(result, Collective):
                    reports.append(result)
    return reports


def _trackers(reports: list[Collective]) -> dict[str, CommTracker]:
    params = DetectorParams()
    trackers: dict[str, CommTracker] = {}
    for report in reports:
        if report.comm not in trackers:
            tracker = CommTracker(report.job, report.comm, report.comm_size, params)
            tracker.sync_every_ns = SYNC_EVERY_NS
            trackers[report.comm] = tracker
    return trackers


def baseline(reports: list[Collective]) -> tuple[Run, dict[str, CommTracker]]:
    trackers = _trackers(reports)
    latencies = []
    clock = time.perf_counter
    started = clock()
    for report in reports:
        at = clock()
        trackers[report.comm].ingest(report)
        latencies.append((clock() - at) * 1e6)
    took = clock() - started
    return Run("one tracker (baseline)", took, took, 0.0, latencies), trackers


def sharded(reports: list[Collective], shards: int) -> tuple[Run, dict[str, CommTracker]]:
    trackers = _trackers(reports)
    merges = {comm: SeqMerge(tracker) for comm, tracker in trackers.items()}
    nodes = sorted({report.node or "" for report in reports})
    shard_of = {node: i % shards for i, node in enumerate(nodes)}
    stages: list[dict[str, ShardComm]] = [{} for _ in range(shards)]
    node_s = [0.0] * shards
    job_s = 0.0
    latencies = []
    clock = time.perf_counter
    for report in reports:
        index = shard_of[report.node or ""]
        stage = stages[index]
        at = clock()
        comm = stage.get(report.comm)
        if comm is None:
            comm = stage[report.comm] = ShardComm(report.comm, report.comm_size)
        ops = report.ops
        comm.ingest(report.rank, report.ts_ns, ops.seq, ops.op, ops.bytes, ops.enter_ns, ops.end_ns)
        parts = comm.drain()
        took = clock() - at
        node_s[index] += took
        latencies.append(took * 1e6)
        if parts:
            at = clock()
            merge = merges[report.comm]
            for part in parts:
                merge.add(part)
            job_s += clock() - at
    run = Run(f"{shards} shard(s)", max(node_s), sum(node_s), job_s, latencies)
    return run, trackers


def learnt(trackers: dict[str, CommTracker]) -> list[object]:
    return [
        (t.ops_seen, t.spans.state(), sorted((k, b.state()) for k, b in t.baselines.items()))
        for t in trackers.values()
    ] + [[(seq, list(ends)) for seq, ends in t.syncs] for t in trackers.values()]


def peak_mib(reports: list[Collective], shards: int) -> float:
    tracemalloc.start()
    kept = baseline(reports) if shards == 0 else sharded(reports, shards)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del kept
    return peak / (1 << 20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="a recorded job (c4 simulate --out)")
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    counts = [int(each) for each in args.shards.split(",")]
    reports = load(args.file)
    operations = sum(len(report.ops.seq) for report in reports)
    gc.freeze()  # the decoded reports: not walked by every collection
    print(
        f"{args.file.name}: {len(reports):,} collective reports, {operations:,} operations; "
        f"core: {native.status()}; medians of {args.repeats}"
    )
    ways = [0, *counts]
    rows: dict[int, list[Run]] = {way: [] for way in ways}
    for _ in range(args.repeats):
        expected = None
        for way in ways:
            run, trackers = baseline(reports) if way == 0 else sharded(reports, way)
            rows[way].append(run)
            got = learnt(trackers)
            if expected is None:
                expected = got
            elif got != expected:
                print(f"{run.name}: learnt differs from the baseline", file=sys.stderr)
                return 1
    print(
        f"{'way':<24}{'job us/op':>10}{'node us/op':>11}{'node ops/s':>12}"
        f"{'all us/op':>10}{'p50 us':>8}{'p99 us':>8}{'peak MiB':>10}{'job share':>10}"
    )
    for way in ways:
        runs = rows[way]
        job = statistics.median(r.job_s for r in runs)
        node = statistics.median(r.node_s for r in runs)
        total = statistics.median(r.node_total_s for r in runs)
        latencies = sorted(runs[0].per_report_us)
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[int(len(latencies) * 0.99)]
        peak = peak_mib(reports, way)
        share = job / (job + total) if job + total else 0.0
        print(
            f"{runs[0].name:<24}{job / operations * 1e6:>10.3f}{node / operations * 1e6:>11.3f}"
            f"{operations / node:>12,.0f}{(job + total) / operations * 1e6:>10.3f}"
            f"{p50:>8.1f}{p99:>8.1f}{peak:>10.1f}{share:>10.1%}"
        )
    print(
        "job us/op: the job stage's merge per operation; node us/op: the busiest shard's"
        " ingest per operation\n(what S workers each spend); all: both sides in one process;"
        " job share: of all"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
