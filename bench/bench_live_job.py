"""One large data-parallel job, live: the operations per second one `c4 streams worker`
keeps up with, and so the largest such job it can follow.

For each size, a data-parallel job (one group over every rank, a tensor-parallel group per
node, about 10 operations per rank per second, one GPU slowed; `bench_replay_scale`'s
``dp`` shape) is simulated for ``--duration-s`` of event time, its records as node agents
send them (``collectives``, ``links`` and ``gpus`` batches per node and interval), and
again with each link and GPU report in a record of its own (as agents sent them before the
``links`` and ``gpus`` batches). For each drain, fresh topics are created, ``--workers``
worker processes of one group start on them, and once each holds its partitions the job
is produced at full speed and drained. The batched job is drained by 1 and 2 workers of
this tree; the unbatched one by 1 worker of this tree and of the ``--baseline REF`` commit,
compiled as this one is, and the batched one too where that commit takes ``links`` and
``gpus`` batches.

The rate is the workers' operations counters over the steady part (10% to 90% of the job's
operations). A worker keeps up with a job whose offered rate (operations per rank per
second x ranks) is below its rate: the largest job it follows at R operations per rank per
second is its rate / R ranks. One job's collective reports are one partition: a second
worker takes only the node-keyed work (link and GPU reports) off the job's worker; the
job CPU column says how much of the work stays with it (issue 34, part 2).

    python bench/bench_live_job.py [--ranks 1024,4096] [--workers 1,2] [--baseline REF]
        [--split] [--no-single]

With ``--split`` the batched job is also drained by split workers (`c4 streams worker
--split`), of this tree and of the baseline where it has them.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
from bench_load import clean_up
from bench_replay import export
from bench_replay_scale import build_baseline, data_parallel
from bench_streams import BOOTSTRAP, REPO, free_port, metric, peak_rss_mib, producer, send

from schemas.topics import TOPICS_BY_KIND
from streams.core import native

MiB = 1 << 20


@dataclass(frozen=True)
class Simulated:
    """A simulated job's records, as agents send them: (topic, key, value) in order."""

    ranks: int
    node_batches: bool
    records: list[tuple[str, bytes, bytes]]
    operations: int
    event_s: float


@dataclass(frozen=True)
class Drained:
    """Workers draining the job: their rate, and how the work spread over them."""

    ops_per_s: float
    seconds: float
    peak_mib: float  # the largest worker's
    job_cpu_share: float  # the worker that holds the job's collective partition
    # ops/s over each fifth of the job's operations: while the producer writes a long job,
    # it and the broker take the second core, so the first fifths are no steady state
    fifths: tuple[float | None, ...]


def simulate_job(work: Path, ranks: int, duration_s: float, node_batches: bool) -> Simulated:
    """Simulate the job, batched as agents send it (``c4 simulate --batch``).

    ``node_batches`` False: each link and GPU message in a record of its own, as agents
    sent them before the ``links`` and ``gpus`` batches (and as other producers may)."""
    spec = work / f"dp-{ranks}.json"
    spec.write_bytes(orjson.dumps(data_parallel(ranks, duration_s)))
    out = work / f"dp-{ranks}.jsonl"
    if not out.exists():
        subprocess.run(  # noqa: S603 -- this interpreter, our own command
            [sys.executable, "-m", "c4.cli", "simulate", "--scenario", str(spec), "--batch"]
            + ["--out", str(out)],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    records: list[tuple[str, bytes, bytes]] = []
    operations = 0
    first = last = None
    with out.open("rb") as lines:
        for line in lines:
            message = orjson.loads(line)
            kind = message["kind"]
            key = message.get("job") if kind in ("collectives", "job") else message.get("node")
            topic = TOPICS_BY_KIND[kind].name
            if kind == "collectives":
                for inner in message["messages"]:
                    operations += len(inner["ops"]["seq"])
            if kind in ("collectives", "link", "links"):
                first = message["ts_ns"] if first is None else first
                last = message["ts_ns"]
            if kind in ("links", "gpus") and not node_batches:
                values = [orjson.dumps(inner) for inner in message["messages"]]
            else:
                values = [line.rstrip()]
            records.extend((topic, str(key).encode(), value) for value in values)
    event_s = ((last or 0) - (first or 0)) / 1e9
    return Simulated(ranks, node_batches, records, operations, event_s)


def produce(job: Simulated, prefix: str) -> None:
    """Every record of the job to its topic under ``prefix``, as fast as the broker takes."""
    sink = producer()
    for topic, key, value in job.records:
        send(sink, prefix + topic, key, value)
    sink.flush(120)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(tree: Path, job: Simulated, work: Path, workers: int, split: bool = False) -> Drained:
    """``workers`` workers of ``tree`` in one group on fresh topics; once each holds its
    partitions, the job is produced and drained. Their rate over the steady part, the
    largest one's peak memory, and the share of their CPU time the job's worker took."""
    prefix = f"bench.live.{uuid.uuid4().hex[:6]}."
    ports, processes, app_id = start_workers(tree, prefix, "bench-live", workers, work, split)
    name = 'c4_stream_operations_total{training_job="job-dp"}'
    marks: list[tuple[float, float, list[float], list[float]]] = []
    try:
        wait_assigned(ports, processes)
        produce(job, prefix)
        deadline = time.monotonic() + 1800
        count = 0.0
        while count < job.operations and time.monotonic() < deadline:
            if any(process.poll() is not None for process in processes):
                message = f"a worker exited; logs in {work}"
                raise RuntimeError(message)
            counts = [metric(port, name) for port in ports]
            count = sum(counts)
            cpu = [cpu_seconds(process.pid) for process in processes]
            marks.append((time.monotonic(), count, counts, cpu))
            time.sleep(0.2)
        peak = max(peak_rss_mib(process.pid) for process in processes)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(60)
        clean_up(prefix, app_id)  # thousands of partitions left slow the broker's start
    if count < job.operations:
        message = f"the workers took {count:.0f} of {job.operations} operations in 30 minutes"
        raise RuntimeError(message)
    low, high = 0.1 * job.operations, 0.9 * job.operations
    start = next(mark for mark in marks if mark[1] >= low)
    end = next(mark for mark in marks if mark[1] >= high)
    spent = [after - before for before, after in zip(start[3], end[3], strict=True)]
    job_worker = max(range(workers), key=lambda index: end[2][index])
    share = spent[job_worker] / max(sum(spent), 1e-9)
    rate = (high - low) / max(end[0] - start[0], 1e-9)
    return Drained(rate, end[0] - start[0], peak, share, _fifths(marks, job.operations))


def _fifths(
    marks: list[tuple[float, float, list[float], list[float]]], total: int
) -> tuple[float | None, ...]:
    """The drain's rate over each fifth of the operations (from the counters' samples, every
    0.2 s); None for a fifth taken within one sample (a small job)."""
    bounds = [next(mark for mark in marks if mark[1] >= total * k / 5) for k in range(5)]
    bounds.append(marks[-1])
    return tuple(
        (after[1] - before[1]) / (after[0] - before[0]) if after[0] > before[0] else None
        for before, after in itertools.pairwise(bounds)
    )


def start_workers(
    tree: Path, prefix: str, group: str, workers: int, work: Path, split: bool = False
) -> tuple[list[int], list[subprocess.Popen[bytes]], str]:
    """Fresh topics under ``prefix``, then ``workers`` workers of ``tree`` in one new group
    on them (their logs in ``work``; ``split``: one job spread over them): each one's
    metrics port and process, and the group's app id (its internal topics' prefix)."""
    env = dict(
        os.environ, PYTHONPATH=str(tree), C4_TOPIC_PREFIX=prefix, C4_KAFKA_BOOTSTRAP=BOOTSTRAP
    )
    if split:
        env["C4_STREAMS_SPLIT"] = "1"
    subprocess.run(  # noqa: S603 -- our own command
        [sys.executable, "-m", "c4.cli", "topics", "create", "--retention-ms", "3600000"],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    app_id = f"{group}-{uuid.uuid4().hex[:6]}"
    ports = [free_port() for _ in range(workers)]
    processes = []
    for index, port in enumerate(ports):
        argv = [
            *(sys.executable, "-m", "c4.cli", "streams", "worker", "--app-id", app_id),
            *("--metrics-port", str(port), "--web-port", str(free_port()), "--loglevel", "warn"),
        ]
        with (work / f"{app_id}-{index}.log").open("wb") as out:
            processes.append(
                subprocess.Popen(argv, env=env, cwd=tree, stdout=out, stderr=out)  # noqa: S603
            )
    return ports, processes, app_id


def wait_assigned(ports: list[int], processes: list[subprocess.Popen[bytes]]) -> None:
    """Until every worker reports consumer lag of some topic (it holds partitions) and a
    few seconds more for the group to settle."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(process.poll() is not None for process in processes):
            message = "a worker exited before the drain"
            raise RuntimeError(message)
        if all(_holds_partitions(port) for port in ports):
            time.sleep(3)
            return
        time.sleep(0.5)
    message = "the workers did not all get partitions in 2 minutes"
    raise RuntimeError(message)


def _holds_partitions(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            text = response.read().decode()
    except OSError:
        return False
    return any(line.startswith("c4_stream_consumer_lag{") for line in text.splitlines())


def _knows_node_batches(tree: Path) -> bool:
    """Whether a tree takes the ``links`` and ``gpus`` batches (c4 from ebdc12a on)."""
    return "class Links(" in (tree / "schemas" / "messages.py").read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,4096")
    parser.add_argument("--duration-s", type=float, default=20.0, help="event time simulated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="worker counts to drain with")
    parser.add_argument("--baseline", default=None, help="commit to compare against")
    parser.add_argument(
        "--split",
        action="store_true",
        help="the batched job also drained by split workers (one job over the workers)",
    )
    parser.add_argument("--no-single", action="store_true", help="skip the unbatched job")
    parser.add_argument(
        "--split-only", action="store_true", help="with --split: only the split workers' rows"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.ranks.split(",")]
    counts = [int(count) for count in args.workers.split(",")]
    work = Path(tempfile.mkdtemp(prefix="c4-bench-live-job-"))
    baseline = None
    if args.baseline:
        baseline = export(args.baseline, work)
        build_baseline(baseline)
    core = native.build_status()
    load = os.getloadavg()[0]
    print(
        f"one data-parallel job live, produced at full speed into fresh topics and drained by "
        f"workers in one group; {args.duration_s:.0f} s of event time; medians of "
        f"{args.repeats}; detection core: {core}; load average {load:.1f} at the start"
    )
    print(
        f"{'ranks':>6} {'hardware':>8} {'records':>8} {'ops':>10} {'ops/rank/s':>10} "
        f"{'tree':<18} {'workers':>7} {'ops/s':>9} {'drain s':>8} {'peak MiB':>9} "
        f"{'job CPU':>8} {'keeps up':>8} {'largest job':>12}  ops/s by fifth (first run)"
    )
    for ranks in sizes:
        batched = simulate_job(work, ranks, args.duration_s, node_batches=True)
        plan = [] if args.split_only else [("this tree", REPO, batched, c, False) for c in counts]
        if args.split:
            plan.extend(("this tree split", REPO, batched, count, True) for count in counts)
        single = None
        if not args.no_single:
            single = simulate_job(work, ranks, args.duration_s, node_batches=False)
            plan.append(("this tree", REPO, single, 1, False))
        if baseline is not None:
            if single is not None:
                plan.append((f"baseline {args.baseline}", baseline, single, 1, False))
            if _knows_node_batches(baseline) and not args.split_only:
                plan.append((f"baseline {args.baseline}", baseline, batched, 1, False))
            if args.split and (baseline / "streams" / "split_app.py").exists():
                plan.extend(
                    (f"base {args.baseline} split", baseline, batched, count, True)
                    for count in counts
                )
        for label, tree, job, workers, split in plan:
            offered = job.operations / job.event_s
            per_rank = offered / ranks
            runs = [drain(tree, job, work, workers, split) for _ in range(args.repeats)]
            rate = statistics.median(run.ops_per_s for run in runs)
            seconds = statistics.median(run.seconds for run in runs)
            peak = statistics.median(run.peak_mib for run in runs)
            share = statistics.median(run.job_cpu_share for run in runs)
            keeps = "yes" if rate >= offered else "no"
            hardware = "batched" if job.node_batches else "single"
            print(
                f"{ranks:>6} {hardware:>8} {len(job.records):>8,} {job.operations:>10,} "
                f"{per_rank:>10.1f} {label:<18} {workers:>7} {rate:>9,.0f} {seconds:>8.1f} "
                f"{peak:>9.0f} {share:>8.0%} {keeps:>8} {rate / per_rank:>12,.0f}  "
                + " ".join("-" if f is None else f"{f / 1000:.0f}k" for f in runs[0].fifths),
                flush=True,
            )
    print(
        "hardware: link and GPU reports in one record per node and interval (links, gpus"
        " batches) or one record each; ops/s: the workers' operations counters over 10%-90%"
        " of the job's operations; job CPU: the share of the workers' CPU time (10%-90%) that"
        " the worker holding the job's collective partition took; keeps up: ops/s >= the"
        " job's offered rate (ops/rank/s x ranks); largest job: ops/s / (ops/rank/s), in"
        " ranks; by fifth: ops/s over each fifth of the job's operations (the first fifth"
        " includes the wait for the first records)"
    )
    print(f"load average {os.getloadavg()[0]:.1f} at the end; logs: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
