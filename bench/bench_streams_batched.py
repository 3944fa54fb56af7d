"""Live workers on realistic message sizes: node batches, and 1, 2 and 4 worker processes.

The records are those node agents send for 3D-parallel MoE jobs (tp 8 inside a node, a
1F1B pipeline over point-to-point pairs, data and expert parallel groups across nodes),
simulated with a 0.5 s reporting interval: about 10 operations per collective message, one
``collectives`` record per job, node and interval. They are preloaded on a fresh topic
(with the jobs' placements) and drained by:

- 1, 2 and 4 ``c4 streams worker`` processes of one consumer group;
- one decode-only process (the same decoding agents, no detectors): the ceiling;
- one worker on the same messages unbatched (one record each): the baseline.

Prints, for each, collective messages/s and operations/s in all and per process (steady
part: 10% to 90% of the messages, from the processes' Prometheus counters), the largest
consumer lag seen, and peak memory (VmHWM) per process; medians of ``--runs``.

    python bench/bench_streams_batched.py [--jobs 8] [--nodes 16] [--seconds 8] [--runs 2]

Targets (issue #18): one worker process >= 1M operations/s and >= 50% of the decode-only
ceiling. Last result: bench/results/streams-batched.txt.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_replay import scenario as replay_scenario  # noqa: E402
from bench_streams import (  # noqa: E402
    BOOTSTRAP,
    c4,
    free_port,
    metric,
    peak_rss_mib,
    produce_all,
    worker_argv,
)

MIB = 1 << 20
PARTITIONS = 8
TARGET_OPS = 1_000_000
TARGET_SHARE = 0.5
COUNTER = 'c4_stream_messages_total{kind="collective"}'
# A drain that counts nothing new for this long has stalled.
STALL_S = 60.0
LAG = "c4_stream_consumer_lag"


def scenario(jobs: int, nodes: int, seconds: float) -> dict[str, object]:
    """``jobs`` 3D MoE jobs of ``nodes`` nodes each, one reporting interval per 0.5 s."""
    return {**replay_scenario(nodes, seconds, 0.5, jobs), "faults": [], "emit_routes": False}


@dataclass(frozen=True)
class Records:
    """One preloaded topic set: its prefix, collective records, messages and operations."""

    prefix: str
    records: int
    messages: int
    operations: int
    mib: float


def load(folder: Path, spec: Path, pack: bool) -> Records:
    """Simulate, then preload a fresh set of topics with the run's records."""
    out = folder / ("batched.jsonl" if pack else "single.jsonl")
    c4(
        "simulate",
        "--scenario",
        str(spec),
        "--out",
        str(out),
        *(["--batch"] if pack else []),
        env=dict(os.environ),
    )
    collective: list[tuple[int, str, bytes]] = []
    placements: list[tuple[int, str, bytes]] = []
    messages = operations = size = 0
    with out.open("rb") as lines:
        for line in lines:
            record = orjson.loads(line)
            kind = record["kind"]
            if kind in ("collective", "collectives"):
                inner = record["messages"] if kind == "collectives" else [record]
                messages += len(inner)
                operations += sum(len(m["ops"]["seq"]) for m in inner)
                size += len(line)
                collective.append((record["ts_ns"], record["job"], line.rstrip(b"\n")))
            elif kind == "job":
                placements.append((record["ts_ns"], record["job"], line.rstrip(b"\n")))
    prefix = f"bench.{uuid.uuid4().hex[:6]}."
    env = dict(os.environ, C4_TOPIC_PREFIX=prefix, C4_KAFKA_BOOTSTRAP=BOOTSTRAP)
    c4("topics", "create", "--partitions", str(PARTITIONS), "--retention-ms", "3600000", env=env)
    produce_all(prefix + "c4.job.v1", placements)
    produce_all(prefix + "c4.collective.v1", collective)
    return Records(prefix, len(collective), messages, operations, size / MIB)


@dataclass(frozen=True)
class Drain:
    """Processes of one group draining a preloaded topic."""

    rate: float  # collective messages/s, all processes together (steady part)
    peak_mib: float  # the largest VmHWM of the processes
    max_lag: float  # the largest consumer lag any process reported
    taken: float  # messages counted when the drain ended (short of all: it stalled)


def drain(kind: str, records: Records, processes: int, log: Path, stall_s: float) -> Drain:
    app_id = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        C4_TOPIC_PREFIX=records.prefix,
        C4_KAFKA_BOOTSTRAP=BOOTSTRAP,
        C4_TOPIC_PARTITIONS=str(PARTITIONS),
    )
    running: list[tuple[subprocess.Popen[bytes], int]] = []
    marks: list[tuple[float, float]] = []
    max_lag = 0.0
    try:
        for index in range(processes):
            port = free_port()
            if kind == "decode-only":
                argv = [
                    sys.executable,
                    str(REPO / "bench" / "decode_only_app.py"),
                    "worker",
                    "--without-web",
                    "-l",
                    "warn",
                ]
            else:
                argv = worker_argv(app_id, port)
            run_env = dict(env, C4_BENCH_APP_ID=app_id, C4_BENCH_METRICS_PORT=str(port))
            out = (log.parent / f"{log.stem}-{index}.log").open("wb")
            process = subprocess.Popen(argv, env=run_env, cwd=REPO, stdout=out, stderr=out)  # noqa: S603
            running.append((process, port))
        count = 0.0
        progress_at = time.monotonic()
        while count < records.messages and time.monotonic() - progress_at < stall_s:
            for process, _ in running:
                if process.poll() is not None:
                    message = f"{kind} exited; see {log.parent}"
                    raise RuntimeError(message)
            now_count = sum(metric(port, COUNTER) for _, port in running)
            if now_count > count:
                count, progress_at = now_count, time.monotonic()
            marks.append((time.monotonic(), count))
            if kind == "worker":
                max_lag = max([max_lag, *(lag(port) for _, port in running)])
            time.sleep(0.2)
        peak = max(peak_rss_mib(process.pid) for process, _ in running)
    finally:
        for process, _ in running:
            process.terminate()
        for process, _ in running:
            process.wait(60)
    low, high = 0.1 * records.messages, 0.9 * records.messages
    if marks[-1][1] < high:  # stalled: no steady rate to speak of
        return Drain(float("nan"), peak, max_lag, marks[-1][1])
    t_low = min(t for t, c in marks if c >= low)
    t_high = min(t for t, c in marks if c >= high)
    return Drain((high - low) / max(t_high - t_low, 1e-9), peak, max_lag, marks[-1][1])


def lag(port: int) -> float:
    """A worker's consumer lag on the collective topic (records behind, its partitions)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:  # noqa: S310
            text = answer.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(LAG + "{") and "collective" in line
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--stall-s", type=float, default=STALL_S, help="no progress: stalled")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="c4-bench-batched-"))
    spec = work / "scenario.json"
    spec.write_bytes(orjson.dumps(scenario(args.jobs, args.nodes, args.seconds)))
    batched = load(work, spec, pack=True)
    single = load(work, spec, pack=False)
    per_message = batched.operations / batched.messages
    counts = [int(n) for n in args.processes.split(",")]
    cases = [
        *((f"worker x{n}, batched", "worker", batched, n) for n in counts),
        ("decode-only x1, batched", "decode-only", batched, 1),
        ("worker x1, one record per message", "worker", single, 1),
    ]
    results: dict[str, list[Drain]] = {name: [] for name, *_ in cases}
    for run in range(args.runs):
        for name, kind, records, processes in cases:
            log = work / f"{kind}-{processes}-{records.records}-{run}.log"
            results[name].append(drain(kind, records, processes, log, args.stall_s))
    print(
        f"{args.jobs} jobs x {args.nodes * 8} ranks (tp 8, pp 4, ep 2), {args.seconds:.0f} s: "
        f"{batched.messages:,} collective messages, {batched.operations:,} operations "
        f"({per_message:.1f} per message); {batched.records:,} batch records "
        f"({batched.messages / batched.records:.0f} messages, "
        f"{batched.mib * 1024 / batched.records:.1f} KiB each) "
        f"or {single.records:,} single ones; {PARTITIONS} partitions; medians of {args.runs} runs"
    )
    print(
        f"{'drained by':<36}{'msgs/s':>10}{'ops/s':>12}{'ops/s/proc':>12}"
        f"{'max lag':>9}{'peak MiB':>10}"
    )
    rates: dict[str, float] = {}
    for name, _, records, processes in cases:
        drains = results[name]
        done = [d for d in drains if d.rate == d.rate]  # runs that did not stall
        stalls = [d for d in drains if d.rate != d.rate]
        rate = statistics.median(d.rate for d in done) if done else float("nan")
        rates[name] = rate
        ops = rate * records.operations / records.messages
        print(
            f"{name:<36}{rate:>10,.0f}{ops:>12,.0f}{ops / processes:>12,.0f}"
            f"{max(d.max_lag for d in drains):>9,.0f}{max(d.peak_mib for d in drains):>10.0f}"
            + "".join(f"  stalled at {d.taken:,.0f} of {records.messages:,}" for d in stalls)
        )
    one = rates[f"worker x{counts[0]}, batched"] * per_message
    ceiling = rates["decode-only x1, batched"] * per_message
    gain = rates[f"worker x{counts[0]}, batched"] / rates["worker x1, one record per message"]
    print(f"one worker, batched vs one record per message: {gain:.2f}x")
    print(
        f"one worker / decode-only: {one / ceiling:.0%} (target {TARGET_SHARE:.0%}: "
        f"{'met' if one / ceiling >= TARGET_SHARE else 'MISSED'})"
    )
    print(
        f"one worker ops/s: {one:,.0f} (target {TARGET_OPS:,}: "
        f"{'met' if one >= TARGET_OPS else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
