"""Detection throughput: replay a 1024-rank job through the engine (issue target 1M ops/s).

Messages carry what a node agent sends: one per rank per communicator per second, ~200
operations each (columnar). Prints ops/s (median of repeats), messages/s, latency of one
message, and peak memory per tracked rank; the target is the named baseline.

    python bench/bench_detect.py [--ranks 1024] [--seconds 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas.codec import decode, encode  # noqa: E402
from schemas.messages import Collective, Ops  # noqa: E402
from streams.core.engine import Engine  # noqa: E402

S = 1_000_000_000
T0 = 1_733_130_000 * S
TARGET_OPS_PER_S = 1_000_000


def job_messages(ranks: int, seconds: int, op_ns: int = 5_000_000) -> list[Collective]:
    """A healthy data-parallel job: every op_ns one allreduce, reported once a second."""
    rng = random.Random(7)  # noqa: S311 - benchmark data
    per_interval = S // op_ns
    messages = []
    for second in range(seconds):
        base = T0 + second * S
        seqs = tuple(range(second * per_interval, (second + 1) * per_interval))
        op_start = [base + i * op_ns for i in range(per_interval)]
        for rank in range(ranks):
            enter = tuple(t + rng.randrange(0, 400_000) for t in op_start)
            end = tuple(t + 4_500_000 for t in op_start)
            ops = Ops.model_construct(
                seq=seqs,
                op=("allreduce",) * per_interval,
                bytes=(1 << 26,) * per_interval,
                enter_ns=enter,
                end_ns=end,
            )
            messages.append(
                Collective.of(
                    job="job-bench",
                    comm="dp",
                    comm_size=ranks,
                    rank=rank,
                    global_rank=rank,
                    node=f"node-{rank // 8:03d}",
                    gpu=rank % 8,
                    ts_ns=base + S,
                    ops=ops,
                    conns=None,
                    trusted=True,
                )
            )
    return messages


def run_once(messages: list[Collective]) -> tuple[float, list[float]]:
    engine = Engine()
    latencies = []
    gc.collect()
    started = time.perf_counter()
    for message in messages:
        before = time.perf_counter()
        engine.process(message)
        latencies.append(time.perf_counter() - before)
    return time.perf_counter() - started, latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    messages = job_messages(args.ranks, args.seconds)
    ops = sum(len(m.ops.seq) for m in messages)
    runs = [run_once(messages) for _ in range(args.repeats)]
    elapsed = statistics.median(r[0] for r in runs)
    latencies = sorted(runs[0][1])
    wire = [encode(m) for m in messages[: min(len(messages), 2048)]]
    started = time.perf_counter()
    for raw in wire:
        decode(raw)
    decode_s = (time.perf_counter() - started) / len(wire)
    tracemalloc.start()
    engine = Engine()
    for message in messages:
        engine.process(message)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    ops_per_s = ops / elapsed
    ops_with_decode = ops / (elapsed + decode_s * len(messages))
    rows = [
        ("ranks", f"{args.ranks}"),
        ("messages", f"{len(messages)}"),
        ("operations", f"{ops}"),
        ("engine ops/s (median of runs)", f"{ops_per_s:,.0f}"),
        ("engine + decode ops/s", f"{ops_with_decode:,.0f}"),
        ("messages/s", f"{len(messages) / elapsed:,.0f}"),
        ("latency per message p50 / p99 (us)", f"{1e6 * p50:.0f} / {1e6 * p99:.0f}"),
        ("decode per message (us)", f"{1e6 * decode_s:.0f}"),
        ("peak memory per tracked rank (KiB)", f"{peak / args.ranks / 1024:.1f}"),
        ("target (baseline) ops/s", f"{TARGET_OPS_PER_S:,}"),
        ("engine vs target", f"{ops_per_s / TARGET_OPS_PER_S:.2f}x"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
