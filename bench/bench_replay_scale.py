"""Replay cost as the job grows: `c4 diagnose` on the same job at 1k, 4k and 16k ranks, per
operation and per rank, for two shapes.

- ``3d``: the 3D-parallel MoE job of `bench_replay.scenario` (tp 8 inside each node, pp 4,
  the rest data and expert parallel): many small groups.
- ``dp``: a data-parallel job (DDP, FSDP/ZeRO over all ranks): one group over every rank
  and a tensor-parallel group per node, about 10 operations per rank per second.

Each is simulated at each size for the same event time (one GPU slowed), then replayed by
``python -m c4.cli diagnose`` ``--repeats`` times. Prints operations/s and microseconds per
operation (medians), peak RSS in all and per rank, each against the smallest size of the
same run: a detector whose cost per operation or memory per rank grows with the job is the
bottleneck at the next size up, whatever the small runs say. ``--baseline REF`` replays the
same files with that commit's tree too (exported with ``git archive``, compiled as this
tree is when this tree's core is), up to ``--baseline-max-ranks``: a detector quadratic in
its group needs minutes there.

    python bench/bench_replay_scale.py [--ranks 1024,4096,16384] [--duration-s 8]
                                       [--shapes 3d,dp] [--baseline 11db0c1]
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
from bench_replay import COMPILED, PURE, export, replay, scenario  # noqa: E402

from streams.core import native  # noqa: E402 -- this tree's

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GPUS_PER_NODE = 8


def data_parallel(ranks: int, duration_s: float) -> dict[str, object]:
    """One data-parallel group over every rank, a tensor-parallel group per node; one GPU
    slowed by 30% from a third of the run."""
    return {
        "name": "bench-replay-dp",
        "seed": 13,
        "duration_s": duration_s,
        "fabric": {"nodes_per_leaf": 4, "spines": 4},
        "jobs": [
            {
                "id": "job-dp",
                "ranks": ranks,
                "comms": ["dp", "tp"],
                "compute_ms": 100.0,
                "op_bytes": 128 * MIB,
                "tp_bytes": 16 * MIB,
                "jitter": 0.02,
            }
        ],
        "faults": [
            {"type": "slow_gpu", "job": "job-dp", "rank": 43, "at_s": duration_s / 3, "factor": 1.3}
        ],
    }


SHAPES = {
    "3d": lambda ranks, duration_s: scenario(ranks // GPUS_PER_NODE, duration_s),
    "dp": data_parallel,
}
TITLES = {
    "3d": "3D MoE job (tp 8, pp 4, ep 2; a GPU slows at 20 s)",
    "dp": "data-parallel job (one group over all ranks, tp 8 per node; a GPU slows at 1/3)",
}


def simulate(
    folder: Path, shape: str, ranks: int, duration_s: float
) -> tuple[Path, int, int, float]:
    """The recorded file, its collective messages and operations, and the simulation time."""
    spec = folder / f"scenario-{shape}-{ranks}.json"
    spec.write_bytes(orjson.dumps(SHAPES[shape](ranks, duration_s)))
    out = folder / f"replay-{shape}-{ranks}.jsonl"
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
    parser.add_argument("--duration-s", type=float, default=8.0, help="event time, 3d shape")
    # A ring over 16k ranks iterates slower: the straggler needs more windows to show.
    parser.add_argument("--dp-duration-s", type=float, default=12.0, help="event time, dp")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", default="3d,dp", help="3d, dp or both")
    parser.add_argument("--baseline", default=None, help="commit to compare against")
    parser.add_argument("--baseline-max-ranks", type=int, default=4096)
    args = parser.parse_args()
    sizes = [int(size) for size in args.ranks.split(",")]
    shapes = args.shapes.split(",")
    if any(shape not in SHAPES for shape in shapes):
        parser.error(f"--shapes: each of {', '.join(SHAPES)}")
    if any(size % (4 * GPUS_PER_NODE) for size in sizes):
        parser.error("--ranks: each size a multiple of 32 (4 pipeline stages of 8-GPU nodes)")
    core = native.build_status()
    compare = core == "compiled"
    with tempfile.TemporaryDirectory(prefix="c4-bench-scale-") as tmp:
        baseline = None
        if args.baseline:
            baseline = export(args.baseline, Path(tmp))
            if compare:
                build_baseline(baseline)
        # What every replay pays before its first message (interpreter, imports): taken
        # out of the cost per operation, which the small files would otherwise overstate.
        empty = Path(tmp) / "empty.jsonl"
        empty.write_bytes(b"")
        startup = statistics.median(replay(ROOT, empty)[0] for _ in range(args.repeats))
        for shape in shapes:
            table = measure(Path(tmp), shape, sizes, args, baseline)
            report(shape, table, args, core, compare, startup)
    return 0


Row = tuple[int, int, int, float, float, float, int, int, float | None, float | None, str]


def measure(
    folder: Path,
    shape: str,
    sizes: list[int],
    args: argparse.Namespace,
    baseline: Path | None,
) -> list[Row]:
    """Per size: ranks, messages, operations, MiB, simulation s, replay s, peak RSS KiB,
    findings, the pure replay's and the baseline's ops/s (None where not run), findings."""
    rows: list[Row] = []
    compare = native.build_status() == "compiled"
    for ranks in sizes:
        duration_s = args.dp_duration_s if shape == "dp" else args.duration_s
        recorded, messages, operations, sim_s = simulate(folder, shape, ranks, duration_s)
        runs, pure_runs, base_runs = [], [], []
        with_baseline = baseline is not None and ranks <= args.baseline_max_ranks
        for _ in range(args.repeats):  # alternately: the noise hits all
            runs.append(replay(ROOT, recorded, COMPILED))
            if compare:
                pure_runs.append(replay(ROOT, recorded, PURE))
            if with_baseline and baseline is not None:
                base_runs.append(replay(baseline, recorded, COMPILED))
        seconds = statistics.median(run[0] for run in runs)
        if pure_runs and pure_runs[0][2] != runs[0][2]:
            found = f"pure {pure_runs[0][2]}, compiled {runs[0][2]}"
            message = f"{shape} {ranks} ranks: the two cores disagree: {found}"
            raise RuntimeError(message)
        pure_rate = operations / statistics.median(r[0] for r in pure_runs) if pure_runs else None
        base_rate = operations / statistics.median(r[0] for r in base_runs) if base_runs else None
        rss_kib = max(run[1] for run in runs)
        size_mib = recorded.stat().st_size / MIB
        firing = "; ".join(runs[0][2]) or "none"
        base_note = ""
        if base_runs and base_runs[0][2] != runs[0][2]:
            base_note = f" (baseline: {'; '.join(base_runs[0][2]) or 'none'})"
        rows.append(
            (
                ranks,
                messages,
                operations,
                size_mib,
                sim_s,
                seconds,
                rss_kib,
                len(runs[0][2]),
                pure_rate,
                base_rate,
                firing + base_note,
            )
        )
        recorded.unlink()
    return rows


def report(
    shape: str, rows: list[Row], args: argparse.Namespace, core: str, compare: bool, startup: float
) -> None:
    """The table of one shape, each size against the smallest."""
    print(
        f"{TITLES[shape]}, {args.dp_duration_s if shape == 'dp' else args.duration_s:.0f} s "
        f"of event time, medians of {args.repeats}; "
        f"against the smallest size; detection core: {core}"
        + ("; pure: the same replay as pure Python (C4_PURE_PYTHON=1)" if compare else "")
        + (f"; baseline: {args.baseline}, as built here" if args.baseline else "")
    )
    print(
        f"{'ranks':>7}{'messages':>11}{'ops':>11}{'ops/msg':>8}{'MiB':>6}{'ops/s':>10}"
        f"{'us/op':>7}{'vs':>6}{'RSS MiB':>9}{'KiB/rank':>10}{'vs':>6}"
        f"{'pure ops/s':>12}{'base ops/s':>12}{'x base':>8}  findings"
    )
    first = rows[0]
    for row in rows:
        ranks, messages, operations, size_mib, _, seconds, rss_kib, _, pure, base, found = row
        per_op = (seconds - startup) / operations * 1e6
        per_rank = rss_kib / ranks
        rate = operations / seconds
        print(
            f"{ranks:>7}{messages:>11,}{operations:>11,}{operations / messages:>8.1f}"
            f"{size_mib:>6.0f}{rate:>10,.0f}{per_op:>7.2f}"
            f"{((first[5] - startup) / first[2]) / ((seconds - startup) / operations):>6.2f}"
            f"{rss_kib / 1024:>9.0f}{per_rank:>10.1f}{(first[6] / first[0]) / per_rank:>6.2f}"
            f"{f'{pure:,.0f}' if pure else '-':>12}{f'{base:,.0f}' if base else '-':>12}"
            f"{f'{rate / base:.2f}' if base else '-':>8}  {found}"
        )
    print(f"us/op: net of the start-up every replay pays ({startup:.2f} s, an empty file)")
    print("vs: the smallest size's figure over this one's (1.00 flat; below 1, costlier per op")
    print("    or per rank as the job grows); RSS includes the interpreter's fixed ~70 MiB;")
    print("    x base: this tree's ops/s over the baseline's on the same file")
    print()


def build_baseline(tree: Path) -> None:
    """The baseline's detection core compiled, as this tree's is (its own build script)."""
    script = tree / "scripts" / "build_native.py"
    if script.exists():
        subprocess.run(  # noqa: S603 -- this interpreter, the baseline's own script
            [sys.executable, str(script)],
            cwd=tree,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


if __name__ == "__main__":
    sys.exit(main())
