"""Live detection on the local broker: one worker process's throughput, and hang latency.

1. Throughput: a topic preloaded with collective messages (256-rank jobs, 64 ops each) is
   drained by `c4 streams worker` and, in the same run, by a decode-only app (the same
   decoding agents, no detectors): messages/s of each from their Prometheus counters
   (steady part: 10% to 90% of the messages), peak memory (VmHWM) of each process.
2. Latency: the worker on fresh topics while 40 jobs publish live (paced, about 10,000
   messages/s); one rank of each of several jobs stops entering its next operation at a
   known moment (a noncomm hang, its peers keep sending heartbeats). Latency = the
   diagnosis arriving at a consumer minus the moment the hang began, against
   hang_after + 3 s.

    python bench/bench_streams.py [--jobs 40] [--preload-s 8] [--runs 2] [--latency-s 24]

Targets (issue #4): >= 10,000 messages/s per worker process, >= 50% of the decode-only
ceiling, hang diagnosis p99 <= hang_after + 3 s. Last result: bench/results/streams.txt.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Producer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schemas.codec import decode  # noqa: E402
from schemas.messages import Diagnosis  # noqa: E402
from streams.core.params import DetectorParams  # noqa: E402

S = 1_000_000_000
MS = 1_000_000
RANKS = 256
OPS_PER_MESSAGE = 64
BOOTSTRAP = os.environ.get("C4_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
TARGET_MSGS = 10_000
TARGET_SHARE = 0.5
SLACK_S = 3.0


@dataclass(frozen=True)
class Hang:
    """Rank ``rank`` of ``job`` never enters operation ``seq`` (starting at ``at_ns``)."""

    job: str
    rank: int
    seq: int
    at_ns: int


def job_interval(
    job: str, second: int, t0: int, hang: Hang | None, rng: random.Random
) -> list[tuple[str, bytes, bytes]]:
    """One reporting second of a 256-rank job: one message per rank, 64 ops each."""
    period = S // OPS_PER_MESSAGE
    first = second * OPS_PER_MESSAGE
    starts = [t0 + (first + i) * period for i in range(OPS_PER_MESSAGE)]
    ts = t0 + (second + 1) * S
    out = []
    for rank in range(RANKS):
        seqs: list[int] = []
        enters: list[int] = []
        ends: list[int | None] = []
        for i, start in enumerate(starts):
            seq = first + i
            if hang is not None and seq >= hang.seq:
                if rank == hang.rank or seq > hang.seq:
                    break  # never entered, or blocked behind the hung operation
                seqs.append(seq)
                enters.append(start + rng.randrange(0, 300_000))
                ends.append(None)  # in flight: waits for the rank that never comes
                continue
            seqs.append(seq)
            enters.append(start + rng.randrange(0, 300_000))
            ends.append(start + 2 * MS)
        message = {
            "v": 1,
            "kind": "collective",
            "job": job,
            "comm": f"{job}-dp",
            "comm_size": RANKS,
            "rank": rank,
            "global_rank": rank,
            "node": f"{job}-node-{rank // 8:02d}",
            "gpu": rank % 8,
            "ts_ns": ts,
            "ops": {
                "seq": seqs,
                "op": ["allreduce"] * len(seqs),
                "bytes": [1 << 24] * len(seqs),
                "enter_ns": enters,
                "end_ns": ends,
            },
        }
        out.append((job, orjson.dumps(message), ts.to_bytes(8, "big")))
    return out


def generate(
    jobs: int, seconds: int, t0: int, hangs: dict[str, Hang]
) -> list[tuple[int, str, bytes]]:
    """(ts_ns, key, value) of every message, in event-time order."""
    rng = random.Random(11)  # noqa: S311 - benchmark data
    out: list[tuple[int, str, bytes]] = []
    for second in range(seconds):
        for j in range(jobs):
            job = f"job-{j:03d}"
            ts = t0 + (second + 1) * S
            out.extend(
                (ts, key, value)
                for key, value, _ in job_interval(job, second, t0, hangs.get(job), rng)
            )
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def c4(*args: str, env: dict[str, str]) -> None:
    subprocess.run(  # noqa: S603 - our own command
        [sys.executable, "-m", "c4.cli", *args], env=env, check=True, capture_output=True
    )


def producer() -> Producer:
    return Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "partitioner": "murmur2_random",
        }
    )


def send(out: Producer, topic: str, key: bytes, value: bytes) -> None:
    """Produce one record, waiting while the producer's queue is full."""
    while True:
        try:
            out.produce(topic, key=key, value=value)
            break
        except BufferError:
            out.poll(0.05)
    out.poll(0)


def produce_all(topic: str, messages: list[tuple[int, str, bytes]]) -> None:
    out = producer()
    for _, key, value in messages:
        send(out, topic, key.encode(), value)
    out.flush(120)


def metric(port: int, name: str) -> float:
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            text = response.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def worker_argv(app_id: str, metrics_port: int) -> list[str]:
    """`c4 streams worker` with its own group, metrics and web ports."""
    return [
        *(sys.executable, "-m", "c4.cli", "streams", "worker", "--app-id", app_id),
        *("--metrics-port", str(metrics_port), "--web-port", str(free_port())),
        *("--loglevel", "warn"),
    ]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Drain:
    """One process draining the preloaded topic."""

    rate: float
    seconds: float
    peak_mib: float


def drain(kind: str, env: dict[str, str], total: int, log: Path) -> Drain:
    port = free_port()
    app_id = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    if kind == "worker":
        argv = worker_argv(app_id, port)
    else:
        argv = [
            sys.executable,
            str(REPO / "bench" / "decode_only_app.py"),
            "worker",
            "--without-web",
            "-l",
            "warn",
        ]
    run_env = dict(env, C4_BENCH_APP_ID=app_id, C4_BENCH_METRICS_PORT=str(port))
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=run_env, cwd=REPO, stdout=out, stderr=out)  # noqa: S603
    name = 'c4_stream_messages_total{kind="collective"}'
    marks: dict[float, float] = {}
    try:
        deadline = time.monotonic() + 600
        count = 0.0
        while count < total and time.monotonic() < deadline:
            if process.poll() is not None:
                message = f"{kind} exited: {log.read_text()[-2000:]}"
                raise RuntimeError(message)
            count = metric(port, name)
            marks[time.monotonic()] = count
            time.sleep(0.2)
        peak = peak_rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(60)
    low, high = 0.1 * total, 0.9 * total
    t_low = min(t for t, c in marks.items() if c >= low)
    t_high = min(t for t, c in marks.items() if c >= high)
    return Drain((high - low) / max(t_high - t_low, 1e-9), t_high - t_low, peak)


def latency_run(
    env: dict[str, str], jobs: int, seconds: int, hang_jobs: int, log: Path
) -> tuple[list[float], float, float]:
    """Hang latencies (s), achieved produce rate, worker peak memory."""
    t0 = time.time_ns() // S * S
    hangs = {}
    for i in range(hang_jobs):
        job = f"job-{i * (jobs // hang_jobs):03d}"
        second = 6 + i * max(1, (seconds - 16) // hang_jobs)
        seq = second * OPS_PER_MESSAGE + 10
        hangs[job] = Hang(job, 1 + 7 * i, seq, t0 + seq * (S // OPS_PER_MESSAGE))
    messages = generate(jobs, seconds, t0, hangs)
    port = free_port()
    app_id = f"bench-latency-{uuid.uuid4().hex[:6]}"
    argv = worker_argv(app_id, port)
    prefix = env["C4_TOPIC_PREFIX"]
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": app_id + "-check",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([prefix + "c4.diagnosis.v1"])
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out, stderr=out)  # noqa: S603
    time.sleep(6)  # the worker joins its group
    found: dict[str, float] = {}
    wall_of_event: list[tuple[int, float]] = []

    def publish() -> None:
        out = producer()
        started = time.monotonic()
        first = messages[0][0] - S
        for ts, key, value in messages:
            due = started + (ts - first) / S
            wait = due - time.monotonic()
            if wait > 0:
                out.flush(0)
                time.sleep(wait)
                wall_of_event.append((ts, time.time()))
            send(out, prefix + "c4.collective.v1", key.encode(), value)
        out.flush(60)

    began = time.monotonic()
    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    deadline = time.monotonic() + seconds + 60
    while time.monotonic() < deadline and len(found) < len(hangs):
        record = consumer.poll(0.2)
        if record is None or record.error() is not None:
            continue
        result = decode(record.value() or b"")
        if isinstance(result, Diagnosis) and result.class_ == "noncomm_hang":
            found.setdefault(str(result.job), time.time())
    thread.join(120)
    produce_rate = len(messages) / (time.monotonic() - began)
    peak = peak_rss_mib(process.pid)
    process.terminate()
    process.wait(60)
    consumer.close()
    # The wall moment a hang began: its event time mapped through the publisher's pacing.
    offset = statistics.median(wall - ts / S for ts, wall in wall_of_event)
    latencies = [
        found[job] - (hang.at_ns / S + offset) for job, hang in hangs.items() if job in found
    ]
    missed = len(hangs) - len(latencies)
    if missed:
        print(f"{missed} hang(s) not diagnosed in time", file=sys.stderr)
    return latencies, produce_rate, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--preload-s", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--latency-s", type=int, default=30)
    parser.add_argument("--hangs", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="c4-bench-streams-"))
    prefix = f"bench.{uuid.uuid4().hex[:6]}."
    env = dict(os.environ, C4_TOPIC_PREFIX=prefix, C4_KAFKA_BOOTSTRAP=BOOTSTRAP)
    c4("topics", "create", "--retention-ms", "3600000", env=env)

    messages = generate(args.jobs, args.preload_s, 1_733_130_000 * S, {})
    size = statistics.mean(len(v) for _, _, v in messages)
    produce_all(prefix + "c4.collective.v1", messages)
    worker, ceiling = [], []
    for run in range(args.runs):
        worker.append(drain("worker", env, len(messages), work / f"worker{run}.log"))
        ceiling.append(drain("decode-only", env, len(messages), work / f"decode{run}.log"))

    latency_prefix = f"bench.{uuid.uuid4().hex[:6]}."
    latency_env = dict(env, C4_TOPIC_PREFIX=latency_prefix)
    c4("topics", "create", "--retention-ms", "3600000", env=latency_env)
    latencies, produce_rate, latency_peak = latency_run(
        latency_env, args.jobs, args.latency_s, args.hangs, work / "latency.log"
    )
    hang_after = DetectorParams().hang_after_ns(None) / S

    worker_rate = statistics.median(d.rate for d in worker)
    ceiling_rate = statistics.median(d.rate for d in ceiling)
    share = worker_rate / ceiling_rate
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) if ordered else float("nan")
    p99 = (
        ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        if ordered
        else float("nan")
    )
    met = "met"
    missed = "MISSED"
    hang_ok = bool(ordered) and p99 <= hang_after + SLACK_S and len(latencies) == args.hangs
    worker_runs = ", ".join(f"{d.rate:,.0f}" for d in worker)
    ceiling_runs = ", ".join(f"{d.rate:,.0f}" for d in ceiling)
    peaks = (
        f"{statistics.median(d.peak_mib for d in worker):.0f} / "
        f"{statistics.median(d.peak_mib for d in ceiling):.0f}"
    )
    rows = [
        ("messages (256 ranks, 64 ops each)", f"{len(messages):,}, {size / 1024:.1f} KiB each"),
        ("worker messages/s (median of runs)", f"{worker_rate:,.0f}  ({worker_runs})"),
        ("worker ops/s", f"{worker_rate * OPS_PER_MESSAGE:,.0f}"),
        ("decode-only messages/s (median)", f"{ceiling_rate:,.0f}  ({ceiling_runs})"),
        ("worker / decode-only", f"{share:.0%}"),
        ("peak memory worker / decode-only (MiB)", peaks),
        ("live load: produced messages/s", f"{produce_rate:,.0f}"),
        ("hangs diagnosed", f"{len(latencies)} of {args.hangs}"),
        ("hang latency p50 / p99 (s)", f"{p50:.2f} / {p99:.2f}"),
        ("hang_after + slack (s)", f"{hang_after + SLACK_S:.1f}"),
        ("worker peak memory under load (MiB)", f"{latency_peak:.0f}"),
        ("target messages/s", f"{TARGET_MSGS:,}: {met if worker_rate >= TARGET_MSGS else missed}"),
        (
            "target share of decode-only",
            f"{TARGET_SHARE:.0%}: {met if share >= TARGET_SHARE else missed}",
        ),
        ("target hang p99", f"<= {hang_after + SLACK_S:.1f} s: {met if hang_ok else missed}"),
    ]
    width = max(len(name) for name, _ in rows)
    report = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
    print(report)
    (REPO / "bench" / "results").mkdir(exist_ok=True)
    (REPO / "bench" / "results" / "streams.txt").write_text(report + "\n")
    print(f"logs: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
