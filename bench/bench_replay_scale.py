"""Replay cost as the job grows: `c4 diagnose` on the same 3D-parallel MoE job at 1k, 4k and
16k ranks, per operation and per rank.

The job of `bench_replay.scenario` (tp 8 inside each node, pp 4, the rest data and expert
parallel) is simulated at each size for the same event time, then replayed
by ``python -m c4.cli diagnose`` ``--repeats`` times. Prints operations/s and microseconds per
operation (medians), peak RSS in all and per rank, each against the smallest size of the
same run: a detector whose cost per operation or memory per rank grows with the job is the
bottleneck at the next size up, whatever the small runs say.

    python bench/bench_replay_scale.py [--ranks 1024,4096,16384] [--duration-s 8]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import COMPILED, PURE, replay, scenario  # noqa: E402

from streams.core import native  # noqa: E402 -- this tree's

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GPUS_PER_NODE = 8


def simulate(folder: Path, ranks: int, duration_s: float) -> tuple[Path, int, int, float]:
    """The recorded file, its collective messages and operations, and the simulation time."""
    spec = folder / f"scenario-{ranks}.json"
    spec.write_bytes(orjson.dumps(scenario(ranks // GPUS_PER_NODE, duration_s)))
    out = folder / f"replay-{ranks}.jsonl"
    started = time.perf_counter()
    subprocess.run(  # noqa: S603 -- this interpreter, our own command
        [sys.executable, "-m", "c4.cli", "simulate", "--scenario", str(spec), "--out", str(out)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    messages = operations = 0
    with out.open("rb") as lines:
        for line in lines:
            if b'"kind":"collective"' in line[:40]:
                messages += 1
                operations += len(orjson.loads(line)["ops"]["seq"])
    return out, messages, operations, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(size) for size in args.ranks.split(",")]
    if any(size % (4 * GPUS_PER_NODE) for size in sizes):
        parser.error("--ranks: each size a multiple of 32 (4 pipeline stages of 8-GPU nodes)")
    rows = []
    pure_rates: list[float | None] = []
    core = native.build_status()
    compare = core == "compiled"
    with tempfile.TemporaryDirectory(prefix="c4-bench-scale-") as tmp:
        for ranks in sizes:
            recorded, messages, operations, sim_s = simulate(Path(tmp), ranks, args.duration_s)
            runs, pure_runs = [], []
            for _ in range(args.repeats):  # alternately: the noise hits both
                runs.append(replay(ROOT, recorded, COMPILED))
                if compare:
                    pure_runs.append(replay(ROOT, recorded, PURE))
            seconds = statistics.median(run[0] for run in runs)
            pure_s = statistics.median(run[0] for run in pure_runs) if pure_runs else None
            if pure_runs and pure_runs[0][2] != runs[0][2]:
                found = f"pure {pure_runs[0][2]}, compiled {runs[0][2]}"
                message = f"{ranks} ranks: the two cores disagree: {found}"
                raise RuntimeError(message)
            rss_kib = max(run[1] for run in runs)
            size_mib = recorded.stat().st_size / MIB
            rows.append(
                (ranks, messages, operations, size_mib, sim_s, seconds, rss_kib, len(runs[0][2]))
            )
            pure_rates.append(operations / pure_s if pure_s else None)
            recorded.unlink()
    print(
        f"3D MoE job (tp 8, pp 4, ep 2; a GPU slows at 20 s), {args.duration_s:.0f} s of "
        f"event time, medians of {args.repeats}; against the smallest size; detection core: "
        f"{core}" + ("; pure: the same replay as pure Python (C4_PURE_PYTHON=1)" if compare else "")
    )
    print(
        f"{'ranks':>7}{'messages':>11}{'ops':>11}{'ops/msg':>8}{'MiB':>7}{'ops/s':>11}"
        f"{'us/op':>7}{'vs':>6}{'RSS MiB':>9}{'KiB/rank':>10}{'vs':>6}{'findings':>9}"
        + (f"{'pure ops/s':>12}{'compiled/pure':>14}" if compare else "")
    )
    first = rows[0]
    for row, pure_rate in zip(rows, pure_rates, strict=True):
        ranks, messages, operations, size_mib, _, seconds, rss_kib, firing = row
        versus = (
            f"{pure_rate:>12,.0f}{operations / seconds / pure_rate:>14.2f}" if pure_rate else ""
        )
        per_op = seconds / operations * 1e6
        per_rank = rss_kib / ranks
        print(
            f"{ranks:>7}{messages:>11,}{operations:>11,}{operations / messages:>8.1f}"
            f"{size_mib:>7.0f}{operations / seconds:>11,.0f}{per_op:>7.2f}"
            f"{(first[5] / first[2]) / (seconds / operations):>6.2f}"
            f"{rss_kib / 1024:>9.0f}{per_rank:>10.1f}{(first[6] / first[0]) / per_rank:>6.2f}"
            f"{firing:>9}{versus}"
        )
    print("vs: the smallest size's figure over this one's (1.00 flat; below 1, costlier per op")
    print("    or per rank as the job grows); RSS includes the interpreter's fixed ~70 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
