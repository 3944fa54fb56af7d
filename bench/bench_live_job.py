"""One large data-parallel job, live: the operations per second one `c4 streams worker`
keeps up with, and so the largest such job it can follow.

For each size, a data-parallel job (one group over every rank, a tensor-parallel group per
node, about 10 operations per rank per second, one GPU slowed; `bench_replay_scale`'s
``dp`` shape) is simulated for ``--duration-s`` of event time, its records as node agents
send them (``collectives`` batches per node and interval, link and GPU reports). They are
preloaded into fresh topics of the local broker and drained by one worker process of this
tree, then (``--baseline REF``) by one of that commit's tree, compiled as this one is, from
the same topics. The rate is the worker's own operations counter over the steady part
(10% to 90% of the job's operations). A worker keeps up with a job whose offered rate
(operations per rank per second x ranks) is below its rate: the largest job it follows at
R operations per rank per second is its rate / R ranks. One job is one partition of the
collective topic: a second worker takes none of its load (issue 34, part 2, not built).

    python bench/bench_live_job.py [--ranks 1024,4096] [--duration-s 20] [--baseline REF]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
from bench_replay import export
from bench_replay_scale import build_baseline, data_parallel
from bench_streams import BOOTSTRAP, REPO, free_port, metric, peak_rss_mib, producer

from schemas.topics import TOPICS_BY_KIND
from streams.core import native

MiB = 1 << 20


@dataclass(frozen=True)
class Recorded:
    """A simulated job preloaded into topics: how much it holds."""

    ranks: int
    prefix: str
    records: int
    operations: int
    event_s: float


@dataclass(frozen=True)
class Drained:
    """One worker draining the preloaded job."""

    ops_per_s: float
    seconds: float
    peak_mib: float


def record(work: Path, ranks: int, duration_s: float) -> Recorded:
    """Simulate the job, batched as agents send it, and produce every record to its topic."""
    spec = work / f"dp-{ranks}.json"
    spec.write_bytes(orjson.dumps(data_parallel(ranks, duration_s)))
    out = work / f"dp-{ranks}.jsonl"
    subprocess.run(  # noqa: S603 -- this interpreter, our own command
        [sys.executable, "-m", "c4.cli", "simulate", "--scenario", str(spec), "--batch"]
        + ["--out", str(out)],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    prefix = f"bench.live.{uuid.uuid4().hex[:6]}."
    env = dict(os.environ, C4_TOPIC_PREFIX=prefix, C4_KAFKA_BOOTSTRAP=BOOTSTRAP)
    subprocess.run(  # noqa: S603 -- our own command
        [sys.executable, "-m", "c4.cli", "topics", "create", "--retention-ms", "3600000"],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    sink = producer()
    records = operations = 0
    first = last = None
    with out.open("rb") as lines:
        for line in lines:
            message = orjson.loads(line)
            kind = message["kind"]
            key = message.get("job") if kind in ("collectives", "job") else message.get("node")
            topic = TOPICS_BY_KIND["collective" if kind == "collectives" else kind].name
            for inner in message.get("messages", ()):
                operations += len(inner["ops"]["seq"])
            if kind in ("collectives", "link"):
                first = message["ts_ns"] if first is None else first
                last = message["ts_ns"]
            while True:
                try:
                    sink.produce(prefix + topic, key=str(key).encode(), value=line.rstrip())
                    break
                except BufferError:
                    sink.poll(0.05)
            records += 1
            sink.poll(0)
    sink.flush(120)
    event_s = ((last or 0) - (first or 0)) / 1e9
    return Recorded(ranks, prefix, records, operations, event_s)


def drain(tree: Path, job: Recorded, log: Path) -> Drained:
    """One worker of ``tree`` on the job's topics, from the start, until every operation is
    counted; its rate over the steady part and its peak memory."""
    port = free_port()
    app_id = f"bench-live-{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        C4_TOPIC_PREFIX=job.prefix,
        C4_KAFKA_BOOTSTRAP=BOOTSTRAP,
    )
    argv = [
        *(sys.executable, "-m", "c4.cli", "streams", "worker", "--app-id", app_id),
        *("--metrics-port", str(port), "--web-port", str(free_port()), "--loglevel", "warn"),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, cwd=tree, stdout=out, stderr=out)  # noqa: S603
    name = 'c4_stream_operations_total{training_job="job-dp"}'
    marks: list[tuple[float, float]] = []
    try:
        deadline = time.monotonic() + 1800
        count = 0.0
        while count < job.operations and time.monotonic() < deadline:
            if process.poll() is not None:
                message = f"the worker exited: {log.read_text()[-2000:]}"
                raise RuntimeError(message)
            count = metric(port, name)
            marks.append((time.monotonic(), count))
            time.sleep(0.2)
        peak = peak_rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(60)
    if count < job.operations:
        message = f"the worker took {count:.0f} of {job.operations} operations in 30 minutes"
        raise RuntimeError(message)
    low, high = 0.1 * job.operations, 0.9 * job.operations
    t_low = min(t for t, c in marks if c >= low)
    t_high = min(t for t, c in marks if c >= high)
    return Drained((high - low) / max(t_high - t_low, 1e-9), t_high - t_low, peak)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,4096")
    parser.add_argument("--duration-s", type=float, default=20.0, help="event time simulated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="commit to compare against")
    args = parser.parse_args()
    sizes = [int(size) for size in args.ranks.split(",")]
    work = Path(tempfile.mkdtemp(prefix="c4-bench-live-job-"))
    trees = [("this tree", REPO)]
    if args.baseline:
        baseline = export(args.baseline, work)
        build_baseline(baseline)
        trees.append((f"baseline {args.baseline}", baseline))
    core = native.build_status()
    load = os.getloadavg()[0]
    print(
        f"one data-parallel job live, one worker, preloaded and drained; "
        f"{args.duration_s:.0f} s of event time; medians of {args.repeats}; "
        f"detection core: {core}; load average {load:.1f} at the start"
    )
    header = (
        f"{'ranks':>6} {'records':>8} {'ops':>10} {'ops/rank/s':>10} {'tree':<18}"
        f" {'ops/s':>9} {'drain s':>8} {'peak MiB':>9} {'keeps up':>8} {'largest job':>12}"
    )
    print(header)
    for ranks in sizes:
        job = record(work, ranks, args.duration_s)
        offered = job.operations / job.event_s
        per_rank = offered / ranks
        for label, tree in trees:
            runs = [drain(tree, job, work / f"worker-{ranks}-{i}.log") for i in range(args.repeats)]
            rate = statistics.median(run.ops_per_s for run in runs)
            seconds = statistics.median(run.seconds for run in runs)
            peak = statistics.median(run.peak_mib for run in runs)
            keeps = "yes" if rate >= offered else "no"
            print(
                f"{ranks:>6} {job.records:>8,} {job.operations:>10,} {per_rank:>10.1f} "
                f"{label:<18} {rate:>9,.0f} {seconds:>8.1f} {peak:>9.0f} {keeps:>8} "
                f"{rate / per_rank:>12,.0f}",
                flush=True,
            )
    print(
        "ops/s: the worker's operations counter over 10%-90% of the job's operations;"
        " keeps up: ops/s >= the job's offered rate (ops/rank/s x ranks);"
        " largest job: ops/s / (ops/rank/s), in ranks"
    )
    print(f"load average {os.getloadavg()[0]:.1f} at the end; logs: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
