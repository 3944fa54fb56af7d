"""bench_load's measurements: what the run's threads share, one sample a second, the rows,
and the watcher that matches each diagnosis to the fault it is about."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from bench_streams import BOOTSTRAP
from confluent_kafka import Consumer, KafkaException, TopicPartition
from load_jobs import Fault

from schemas.codec import decode
from schemas.messages import Diagnosis


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
