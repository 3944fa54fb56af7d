"""Sustained load on one streams worker with a fault every 30 s: lag, memory, faults found.

One `c4 streams worker` process (a subprocess, as in bench_streams.py) on fresh topics of
the local broker, while 256-rank jobs publish live, one message per rank per second with
64 operations each, `--rate` messages/s in all (rounded up to whole jobs), for
`--duration-s`. Every `--fault-every-s` a fault starts in another job and lasts
`--fault-s`, rotating through
  noncomm_hang  a rank stops entering its next operation; its peers wait in it and keep
                sending heartbeats; then the rank enters and the job goes on,
  noncomm_slow  a rank enters every operation 1.5 ms late (a straggler),
  comm_hang     every rank entered an operation that does not finish, then it finishes,
  node_down     a node's 8 ranks stop reporting, their peers wait for them; then it is back.
Messages are encoded on the fly from pre-encoded pieces (per rank: its header; per job and
second: the operation arrays), stamped with the live wall clock, and sent with
confluent_kafka. Every `--row-s` one row: offered, produced (broker log end), consumed
(the worker's counter of messages taken) and late (dropped by the worker as older than its
clock by more than the lateness bound) messages/s, the group's lag (committed offsets against high
watermarks) and the worker's own lag gauge, its CPU and memory (VmRSS), the bench's memory,
faults injected / found. At the end: each fault's detection latency (the diagnosis arriving
at a consumer minus the fault's onset), p50/p99, lag and memory first/last/max, and the
verdicts "lag bounded", "memory flat" and "every fault found". The report is appended to
bench/results/load.txt; topics, groups and the worker's data folder are removed.

    python bench/bench_load.py [--rate 20000] [--duration-s 300] [--fault-every-s 30]

Issue #9 part 4: twice the per-worker target of issue #4 (10,000 messages/s).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import orjson
from bench_streams import (
    BOOTSTRAP,
    MS,
    OPS_PER_MESSAGE,
    RANKS,
    REPO,
    SLACK_S,
    S,
    c4,
    free_port,
    producer,
    worker_argv,
)
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from c4.settings import Settings
from schemas.codec import decode
from schemas.messages import Collective, Diagnosis
from streams.core.engine import Engine
from streams.core.params import DetectorParams
from streams.core.places import gpu_id

KINDS = ("noncomm_hang", "noncomm_slow", "comm_hang", "node_down")
HANGS = ("noncomm_hang", "comm_hang", "node_down")
PERIOD_NS = S // OPS_PER_MESSAGE
OP_NS = 2 * MS  # an operation's transfer time
JITTER_NS = 300_000  # healthy ranks enter within this of each other
STRAGGLER_LAG_NS = 1_500_000
GPUS_PER_NODE = 8
VARIANTS = 8  # jitter patterns per job and second (ranks take them in turn)
EMPTY_OPS = orjson.dumps({"seq": [], "op": [], "bytes": [], "enter_ns": [], "end_ns": []})
RESULTS = REPO / "bench" / "results" / "load.txt"


@dataclass(frozen=True)
class Fault:
    """Fault ``number`` of kind ``kind`` in job ``job`` from ``onset_s`` to ``recover_s``."""

    number: int
    kind: str
    job: str
    onset_s: int  # seconds of the run: the reporting interval it starts in
    recover_s: int
    rank: int  # the culprit rank (node_down: a rank of the culprit node)

    def culprits(self) -> range:
        if self.kind == "node_down":
            first = self.rank // GPUS_PER_NODE * GPUS_PER_NODE
            return range(first, first + GPUS_PER_NODE)
        if self.kind == "comm_hang":
            return range(0)
        return range(self.rank, self.rank + 1)

    def expected_suspect(self) -> str | None:
        node = node_name(self.job, self.rank)
        if self.kind == "node_down":
            return node
        if self.kind == "comm_hang":
            return None  # no connection samples here: the finding names no culprit
        return gpu_id(node, self.rank % GPUS_PER_NODE)


def node_name(job: str, rank: int) -> str:
    return f"{job}-node-{rank // GPUS_PER_NODE:02d}"


def ops_json(seqs: list[int], enters: list[int], ends: list[int | None]) -> bytes:
    n = len(seqs)
    return orjson.dumps(
        {
            "seq": seqs,
            "op": ["allreduce"] * n,
            "bytes": [1 << 24] * n,
            "enter_ns": enters,
            "end_ns": ends,
        }
    )


class JobSim:
    """One 256-rank job: its ranks' reports, second after second, faults included."""

    def __init__(self, index: int, jitter: list[list[int]], phase_ns: int = 0) -> None:
        self.name = f"load-{index:03d}"
        self.phase_ns = phase_ns  # its reporting intervals start this far into each second
        self.key = self.name.encode()
        self.heads = [
            orjson.dumps(
                {
                    "v": 1,
                    "kind": "collective",
                    "job": self.name,
                    "comm": f"{self.name}-dp",
                    "comm_size": RANKS,
                    "rank": rank,
                    "global_rank": rank,
                    "node": node_name(self.name, rank),
                    "gpu": rank % GPUS_PER_NODE,
                }
            )[:-1]
            + b',"ops":'
            for rank in range(RANKS)
        ]
        self.jitter = jitter
        self.next_seq = 0
        self.fault: Fault | None = None
        self.hung = False  # every rank waits in operation next_seq (entered or not)

    def reports(self, second: int, start_ns: int, rng: random.Random) -> Iterator[bytes]:
        """The messages of reporting interval ``second`` (starting at ``start_ns``)."""
        default, special = self._plan(second, start_ns, rng)
        tail = b',"ts_ns":%d}' % (start_ns + S)
        shift = rng.randrange(VARIANTS)
        for rank, head in enumerate(self.heads):
            ops = special.get(rank, default[(rank + shift) % VARIANTS])
            if ops is not None:
                yield head + ops + tail

    def _plan(
        self, second: int, start_ns: int, rng: random.Random
    ) -> tuple[list[bytes], dict[int, bytes | None]]:
        """Operation arrays of most ranks (jitter variants) and of the exceptions (None: silent)."""
        fault = self.fault
        if fault is not None and second >= fault.recover_s and fault.kind not in HANGS:
            self.fault = fault = None
        silent: dict[int, bytes | None] = {}  # None: the rank sends nothing
        if fault is not None and fault.kind == "node_down":
            silent = dict.fromkeys(fault.culprits())
        if self.hung and fault is not None and second < fault.recover_s:
            return [EMPTY_OPS] * VARIANTS, silent  # everyone waits: heartbeats
        if fault is not None and fault.kind in HANGS and second == fault.onset_s:
            self.hung = True
            enters = [[start_ns + row[0]] for row in self.jitter[:VARIANTS]]
            default = [ops_json([self.next_seq], enter, [None]) for enter in enters]
            if fault.kind != "node_down":
                silent = dict.fromkeys(fault.culprits(), EMPTY_OPS)
            return default, silent
        seqs = list(range(self.next_seq, self.next_seq + OPS_PER_MESSAGE))
        starts = [start_ns + i * PERIOD_NS for i in range(OPS_PER_MESSAGE)]
        ends: list[int | None] = [start + OP_NS for start in starts]
        special: dict[int, bytes | None] = {}
        if self.hung and fault is not None:
            # Recovery: the hung operation (seqs[0]) ends now; the culprits enter it only now.
            culprit_enters = [start + rng.randrange(JITTER_NS) for start in starts]
            special = dict.fromkeys(fault.culprits(), ops_json(seqs, culprit_enters, ends))
            self.hung = False
            self.fault = None
        elif fault is not None and fault.kind == "noncomm_slow" and second >= fault.onset_s:
            late = [start + STRAGGLER_LAG_NS + rng.randrange(100_000) for start in starts]
            special = {fault.rank: ops_json(seqs, late, ends)}
        self.next_seq = seqs[-1] + 1
        variants = rng.sample(range(len(self.jitter)), VARIANTS)
        default = [
            ops_json(seqs, [s + j for s, j in zip(starts, self.jitter[v], strict=True)], ends)
            for v in variants
        ]
        return default, special


def schedule(jobs: int, duration_s: int, every_s: int, fault_s: int) -> list[Fault]:
    """A fault every ``every_s`` from ``every_s / 2`` on, each in the next job, kinds in turn."""
    faults: list[Fault] = []
    onset = every_s // 2
    while onset < duration_s - 10:
        number = len(faults)
        job = f"load-{number % jobs:03d}"
        rank = (1 + 37 * number) % RANKS
        kind = KINDS[number % len(KINDS)]
        faults.append(Fault(number + 1, kind, job, onset, onset + fault_s, rank))
        onset += every_s
    return faults


def replay_check(fault_s: int) -> int:
    """Every fault kind in one job, through the detectors offline: the generator is sound."""
    rng = random.Random(5)
    jitter = [[rng.randrange(JITTER_NS) for _ in range(OPS_PER_MESSAGE)] for _ in range(32)]
    every = fault_s + 10
    faults = [
        Fault(i + 1, kind, "load-000", 5 + i * every, 5 + i * every + fault_s, 1 + 37 * i)
        for i, kind in enumerate(KINDS)
    ]
    sim = JobSim(0, jitter)
    engine = Engine()
    t0 = 1_733_130_000 * S
    found: list[tuple[int, Diagnosis]] = []
    for second in range(5 + len(KINDS) * every):
        for fault in faults:
            if fault.onset_s == second:
                sim.fault = fault
        for value in sim.reports(second, t0 + second * S, rng):
            message = decode(value)
            if not isinstance(message, Collective):
                print(f"generator wrote a bad message: {message}", file=sys.stderr)
                return 1
            found.extend((second, d) for d in engine.process(message))
    for second, d in found:
        top = d.suspects[0].id if d.suspects else "-"
        print(f"second {second:3d}: {d.class_:<13} {d.state:<8} suspect {top}")
    for fault in faults:
        hits = [d for _, d in found if d.class_ == fault.kind and d.state == "firing"]
        print(f"{fault.kind}: {'found' if hits else 'MISSED'}")
    return 0


def scrape(port: int) -> dict[str, float]:
    """The worker's Prometheus metrics, by name with labels (empty while it is away)."""
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            text = response.read().decode()
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def proc_status(pid: int | str, key: str) -> float:
    """A /proc/<pid>/status memory figure in MiB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def machine_busy_seconds() -> float:
    """CPU seconds all processors spent busy since boot (not idle, not waiting for I/O)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """One second's measurements."""

    elapsed: float
    offered: int  # messages handed to the producer so far
    produced: int  # messages in the topic (sum of high watermarks)
    consumed: float  # the worker's counter of collective messages taken
    late: float  # its counter of messages dropped as too late
    lag_group: int  # records of the collective topic not committed by the worker's group
    lag_worker: float  # the worker's own c4_stream_consumer_lag, summed
    cpu: float  # the worker's CPU seconds
    bench_cpu: float  # this process's
    busy: float  # the machine's
    rss: float
    bench_rss: float


@dataclass
class Run:
    """What the threads share."""

    t0: int  # wall second at which the first reporting interval starts
    topic: str
    diagnosis_topic: str
    group: str
    metrics_port: int
    pid: int
    faults: list[Fault]
    offered: int = 0
    produced: int = 0  # in the topic once the producer flushed
    published_s: float = 0.0  # seconds from the first reports until then
    behind_s: float = 0.0
    injected: int = 0
    injected_at: dict[int, float] = field(default_factory=dict)
    found: dict[int, tuple[float, str]] = field(default_factory=dict)  # wall, top suspect
    resolved: set[int] = field(default_factory=set)
    others: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    row_samples: list[Sample] = field(default_factory=list)
    sampling: threading.Event = field(default_factory=threading.Event)  # set: stop sampling
    watching: threading.Event = field(default_factory=threading.Event)  # set: stop watching


def watch_diagnoses(run: Run) -> None:
    """Match each firing diagnosis to its fault (class and job); count the others."""
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": run.group + "-check",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([run.diagnosis_topic])
    try:
        while not run.watching.is_set():
            record = consumer.poll(0.5)
            if record is None or record.error() is not None:
                continue
            now = time.time()
            d = decode(record.value() or b"")
            if not isinstance(d, Diagnosis):
                continue
            # Faults of one kind in one job (few jobs, long runs): the earliest not yet found.
            candidates = [
                f
                for f in run.faults
                if f.job == d.job and f.kind == d.class_ and f.number in run.injected_at
            ]
            if d.state == "firing":
                open_faults = [f for f in candidates if f.number not in run.found]
                if open_faults:
                    top = d.suspects[0].id if d.suspects else "-"
                    run.found[open_faults[0].number] = (now, top)
                    continue
                run.others.append(f"{d.class_} {d.job} {[s.id for s in d.suspects[:2]]}")
            else:
                done = [f for f in candidates if f.number in run.found]
                if done:
                    run.resolved.add(done[-1].number)
    finally:
        consumer.close()


def sample_loop(run: Run, row_s: int, rows_out: list[str], out: TextIO) -> None:
    """Measure every second; print a row every ``row_s``."""
    lag_reader = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": run.group})
    metadata = lag_reader.list_topics(run.topic, timeout=10).topics[run.topic]
    partitions = [TopicPartition(run.topic, p) for p in metadata.partitions]
    counter = 'c4_stream_messages_total{kind="collective"}'
    next_row = row_s
    next_at = float(run.t0)
    try:
        while not run.sampling.is_set():
            time.sleep(max(0.0, next_at - time.time()))
            next_at += 1
            metrics = scrape(run.metrics_port)
            try:
                committed = lag_reader.committed(partitions, timeout=5)
                ends = [lag_reader.get_watermark_offsets(tp, timeout=5)[1] for tp in partitions]
            except KafkaException:
                continue
            produced = sum(ends)
            lag = sum(end - max(0, c.offset) for c, end in zip(committed, ends, strict=True))
            sample = Sample(
                elapsed=time.time() - run.t0,
                offered=run.offered,
                produced=produced,
                consumed=metrics.get(counter, 0.0),
                late=metrics.get("c4_stream_late_dropped_total", 0.0),
                lag_group=lag,
                lag_worker=sum(
                    v for k, v in metrics.items() if k.startswith("c4_stream_consumer_lag")
                ),
                cpu=cpu_seconds(run.pid),
                bench_cpu=time.process_time(),
                busy=machine_busy_seconds(),
                rss=proc_status(run.pid, "VmRSS"),
                bench_rss=proc_status("self", "VmRSS"),
            )
            run.samples.append(sample)
            if sample.elapsed >= next_row - 0.5:
                run.row_samples.append(sample)
                row = format_row(run, row_s)
                rows_out.append(row)
                print(row, file=out, flush=True)
                next_row += row_s
    finally:
        lag_reader.close()


ROW_HEADER = (
    f"{'elapsed_s':>9} {'offered/s':>9} {'produced/s':>10} {'consumed/s':>10} {'late/s':>7} "
    f"{'lag_group':>10} {'lag_worker':>10} {'cpu%':>5} {'rss_MiB':>7} {'peak_MiB':>8} "
    f"{'bench_MiB':>9} {'behind_s':>8} {'faults inj/found':>16}"
)


def format_row(run: Run, row_s: int) -> str:
    now = run.samples[-1]
    before = [s for s in run.samples if s.elapsed <= now.elapsed - row_s + 0.5]
    then = before[-1] if before else run.samples[0]
    span = max(now.elapsed - then.elapsed, 1e-9)
    peak = max(s.rss for s in run.samples)
    found = len(run.found)  # written by the watcher thread: only its size is read here
    return (
        f"{now.elapsed:9.0f} {(now.offered - then.offered) / span:9,.0f} "
        f"{(now.produced - then.produced) / span:10,.0f} "
        f"{(now.consumed - then.consumed) / span:10,.0f} {(now.late - then.late) / span:7,.0f} "
        f"{now.lag_group:10,} "
        f"{now.lag_worker:10,.0f} {100 * (now.cpu - then.cpu) / span:5.0f} {now.rss:7.0f} "
        f"{peak:8.0f} {now.bench_rss:9.0f} {run.behind_s:8.1f} "
        f"{f'{run.injected}/{found}':>16}"
    )


def publish(run: Run, sims: list[JobSim], duration_s: int) -> None:
    """Each job's reports at the end of its interval (live event time), faults at onset.

    The jobs' intervals are spread over the second (their phases), as independent agents'
    are: the load comes in a steady stream rather than in one burst a second.
    """
    out = producer()
    rng = random.Random(7)
    onsets = {(fault.job, fault.onset_s): fault for fault in run.faults}
    sent = 0
    for second in range(duration_s):
        for sim in sims:
            start_ns = (run.t0 + second) * S + sim.phase_ns
            wait = (start_ns + S) / S - time.time()
            if wait > 0:
                out.poll(0)
                time.sleep(wait)
            else:
                run.behind_s = max(run.behind_s, -wait)
            fault = onsets.get((sim.name, second))
            if fault is not None:
                sim.fault = fault
                run.injected_at[fault.number] = start_ns / S
                run.injected += 1
            for value in sim.reports(second, start_ns, rng):
                while True:
                    try:
                        out.produce(run.topic, key=sim.key, value=value)
                        break
                    except BufferError:
                        out.poll(0.05)
                sent += 1
                if sent % 512 == 0:
                    out.poll(0)
            run.offered = sent
    out.flush(60)
    run.published_s = time.time() - (run.t0 + 1)  # from the first reports (on time: duration)
    run.produced = sum(log_end(run.topic))


def log_end(topic: str) -> list[int]:
    """The high watermark of each partition of ``topic``."""
    reader = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "bench-load-reader"})
    try:
        metadata = reader.list_topics(topic, timeout=10).topics[topic]
        return [
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in metadata.partitions
        ]
    finally:
        reader.close()


def wait_for_group(group: str, timeout_s: float = 90.0) -> None:
    """Until the worker's consumer group is stable with partitions assigned."""
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            description = admin.describe_consumer_groups([group])[group].result(10)
        except KafkaException:
            description = None
        if description is not None and str(description.state).endswith("STABLE"):
            if any(m.assignment.topic_partitions for m in description.members):
                return
        time.sleep(1)
    message = f"the worker's group {group} did not become stable in {timeout_s:.0f} s"
    raise RuntimeError(message)


def clean_up(prefix: str, group: str) -> None:
    """Delete the run's topics (its prefix and the worker's internal ones) and groups."""
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    names = [n for n in admin.list_topics(timeout=10).topics if n.startswith((prefix, group))]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else []:
        future.result(60)
    for future in admin.delete_consumer_groups([group, group + "-check"]).values():
        try:
            future.result(30)
        except KafkaException:
            pass  # a group that never committed does not exist
    shutil.rmtree(Settings().stack_dir / "faust" / group, ignore_errors=True)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def window(samples: list[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.elapsed < end] or samples[-1:]


def summary(run: Run, args: argparse.Namespace, jobs: int, grace_end: float) -> list[str]:
    samples = run.samples
    first, last = run.row_samples[0], run.row_samples[-1]  # at the first and the last row
    zero = samples[0]
    span = max(last.elapsed - zero.elapsed, 1e-9)
    bench_cores = (last.bench_cpu - zero.bench_cpu) / span
    busy = (last.busy - zero.busy) / span
    duration = args.duration_s
    rate = jobs * RANKS
    lines = ["", f"{'#':>2} {'fault':<13} {'job':<9} {'onset_s':>7} {'latency_s':>9}  suspect"]
    latencies = []
    named, nameable = 0, 0  # faults found with the expected top suspect, of those with one
    for fault in run.faults:
        if fault.number not in run.injected_at:
            continue
        onset = run.injected_at[fault.number]
        expected = fault.expected_suspect()
        if fault.number in run.found:
            wall, top = run.found[fault.number]
            latencies.append(wall - onset)
            nameable += expected is not None
            named += expected is not None and top == expected
            verdict = "" if expected is None else (" (ok)" if top == expected else " (WRONG)")
            shown = f"{wall - onset:9.2f}  {top}{verdict}"
        else:
            shown = f"{'MISSED':>9}  expected {expected or '-'}"
        lines.append(
            f"{fault.number:2d} {fault.kind:<13} {fault.job:<9} {onset - run.t0:7.0f} {shown}"
        )
    injected = len(run.injected_at)
    half = [s for s in samples if s.elapsed >= duration / 2] or samples[-1:]
    mid = window(samples, duration / 2 - args.row_s, duration / 2)
    end = window(samples, duration - args.row_s, duration + 1)
    bound = round(args.lag_bound_s * rate)
    lag_max_half = max(s.lag_group for s in half)
    lag_mid = statistics.mean(s.lag_group for s in mid)
    lag_end = statistics.mean(s.lag_group for s in end)
    lag_ok = lag_max_half <= bound and lag_end <= lag_mid + bound / 10
    # Levels, not peaks: a leak raises the mean; a passing spike shows in the peak.
    rss_mid = statistics.mean(s.rss for s in mid)
    rss_end = statistics.mean(s.rss for s in end)
    growth = (rss_end - rss_mid) / rss_mid if rss_mid else math.inf
    # All that reached the broker over the time it took to send (duration_s when on time).
    achieved = run.produced / max(duration, run.published_s)
    consumed = (last.consumed - zero.consumed) / span
    late = (last.late - zero.late) / span
    found = len(run.found)
    recovering = sum(1 for f in run.faults if f.recover_s < duration and f.number in run.found)
    met = {True: "met", False: "MISSED"}
    target = DetectorParams().hang_after_ns(None) / S + SLACK_S
    p50 = f"{statistics.median(latencies):.2f}" if latencies else "-"
    p99 = f"{percentile(latencies, 0.99):.2f}" if latencies else "-"
    figures = [
        (
            "offered",
            f"{rate:,} msg/s ({jobs} jobs x {RANKS} ranks x 1 report/s, "
            f"{OPS_PER_MESSAGE} ops each; asked {args.rate:,})",
        ),
        (
            "produced (broker log end)",
            f"{achieved:,.0f} msg/s; producer behind schedule at most {run.behind_s:.1f} s",
        ),
        (
            "consumed (worker counters)",
            f"{consumed:,.0f} msg/s taken, {late:,.0f} msg/s dropped as too late "
            f"({last.late:,.0f} in all)",
        ),
        (
            "faults found",
            f"{found} of {injected} (by {grace_end:.0f} s), top suspect right in {named} of "
            f"{nameable}; resolved after recovery: "
            f"{len(run.resolved)} of {recovering}; other findings: {len(run.others)}"
            + (f" {run.others[:3]}" if run.others else ""),
        ),
        ("detection latency p50 / p99", f"{p50} / {p99} s"),
        (
            "lag (group) first/last/max",
            f"{first.lag_group:,} / {last.lag_group:,}"
            f" / {max(s.lag_group for s in samples):,} records",
        ),
        (
            "lag (worker gauge) last/max",
            f"{last.lag_worker:,.0f} / {max(s.lag_worker for s in samples):,.0f}",
        ),
        (
            "worker RSS first/last/max",
            f"{first.rss:.0f} / {last.rss:.0f} / {max(s.rss for s in samples):.0f} MiB",
        ),
        ("worker RSS second half", f"{rss_mid:.0f} -> {rss_end:.0f} MiB ({growth:+.1%})"),
        (
            "CPU cores used (mean)",
            f"worker {(last.cpu - zero.cpu) / span:.2f}, bench {bench_cores:.2f}, the rest "
            f"(broker, other users) {busy - (last.cpu - zero.cpu) / span - bench_cores:.2f}, "
            f"of {os.cpu_count()}",
        ),
        (
            "bench RSS first/last/max",
            f"{first.bench_rss:.0f} / {last.bench_rss:.0f}"
            f" / {max(s.bench_rss for s in samples):.0f} MiB",
        ),
        (
            "lag bounded",
            f"{met[lag_ok]}: max in the second half {lag_max_half:,} <= "
            f"{bound:,} ({args.lag_bound_s:.0f} s of input), and mean of the last {args.row_s} s "
            f"{lag_end:,.0f} <= mean of the {args.row_s} s before mid-run {lag_mid:,.0f} + "
            f"{bound / 10:,.0f} (no growth)",
        ),
        (
            "memory flat",
            f"{met[growth < args.memory_growth]}: worker RSS growth over the "
            f"second half {growth:+.1%} < {args.memory_growth:.0%} (mean of the last {args.row_s}"
            f" s against mean of the {args.row_s} s before mid-run)",
        ),
        (
            "detection latency",
            f"{met[bool(latencies) and percentile(latencies, 0.99) <= target]}: p99 {p99} s <= "
            f"{target:.1f} s (hang_after + 3 s, issue #4's hang target, for every kind here)",
        ),
        ("every fault found", f"{met[injected > 0 and found == injected]}: {found} of {injected}"),
    ]
    width = max(len(name) for name, _ in figures)
    lines.append("")
    lines.extend(f"{name:<{width}}  {value}" for name, value in figures)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=int, default=20_000, help="messages/s offered")
    parser.add_argument("--duration-s", type=int, default=300)
    parser.add_argument("--fault-every-s", type=int, default=30)
    parser.add_argument("--fault-s", type=int, default=20, help="how long each fault lasts")
    parser.add_argument("--row-s", type=int, default=30, help="seconds between rows")
    parser.add_argument("--grace-s", type=int, default=30, help="wait for diagnoses after")
    parser.add_argument("--lag-bound-s", type=float, default=10.0)
    parser.add_argument("--memory-growth", type=float, default=0.10)
    parser.add_argument("--note", default="", help="a line for the results file")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--replay-check", action="store_true", help="only run each fault kind offline"
    )
    args = parser.parse_args()
    if not 0 < args.fault_s < args.fault_every_s:
        parser.error("--fault-s must be above 0 and below --fault-every-s")
    if args.replay_check:
        return replay_check(args.fault_s)
    jobs = max(1, math.ceil(args.rate / RANKS))
    faults = schedule(jobs, args.duration_s, args.fault_every_s, args.fault_s)
    prefix = f"bench.{uuid.uuid4().hex[:6]}."
    group = f"bench-load-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, C4_TOPIC_PREFIX=prefix, C4_KAFKA_BOOTSTRAP=BOOTSTRAP)
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()[0]
    log = Path(f"/tmp/{group}.log")  # noqa: S108 - a bench's log, named per run
    c4("topics", "create", "--retention-ms", "3600000", env=env)
    jitter_rng = random.Random(3)
    jitter = [[jitter_rng.randrange(JITTER_NS) for _ in range(OPS_PER_MESSAGE)] for _ in range(32)]
    sims = [JobSim(i, jitter, i * S // jobs) for i in range(jobs)]
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(  # noqa: S603 - our own command
            worker_argv(group, port), env=env, cwd=REPO, stdout=sink, stderr=sink
        )
    rows: list[str] = []
    run: Run | None = None
    threads: list[threading.Thread] = []
    grace_end = args.duration_s + args.grace_s
    try:
        wait_for_group(group)
        run = Run(
            t0=math.ceil(time.time()) + 2,
            topic=prefix + "c4.collective.v1",
            diagnosis_topic=prefix + "c4.diagnosis.v1",
            group=group,
            metrics_port=port,
            pid=process.pid,
            faults=faults,
        )
        print(f"{jobs} jobs, {jobs * RANKS:,} msg/s, {len(faults)} faults; worker log {log}")
        print(ROW_HEADER, flush=True)
        threads = [
            threading.Thread(target=watch_diagnoses, args=(run,)),
            threading.Thread(target=sample_loop, args=(run, args.row_s, rows, sys.stdout)),
        ]
        for thread in threads:
            thread.start()
        publish(run, sims, args.duration_s)
        time.sleep(max(0.0, run.t0 + args.duration_s + 0.5 - time.time()))
        run.sampling.set()  # the rows end with the load; diagnoses may still come a while
        threads[1].join(30)
        deadline = run.t0 + grace_end
        while time.time() < deadline and len(run.found) < len(run.injected_at):
            time.sleep(0.5)
        if process.poll() is not None:
            print(f"the worker exited ({process.returncode}); see {log}", file=sys.stderr)
    finally:
        if run is not None:
            run.sampling.set()
            run.watching.set()
        for thread in threads:
            thread.join(30)
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        clean_up(prefix, group)
    if not run.row_samples:
        print("no rows taken", file=sys.stderr)
        return 1
    lines = summary(run, args, jobs, grace_end)
    print("\n".join(lines))
    command = "python bench/bench_load.py " + shlex.join(sys.argv[1:])
    header = [
        f"== {started:%Y-%m-%d %H:%M} UTC  {command}",
        f"machine: {os.cpu_count()} CPUs, load average (1 min) {load_before:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end" + (f"; {args.note}" if args.note else ""),
        "",
        ROW_HEADER,
    ]
    args.results.parent.mkdir(exist_ok=True)
    with args.results.open("a") as results:
        results.write("\n".join([*header, *rows, *lines]) + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
