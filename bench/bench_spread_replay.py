"""``c4 diagnose --workers N`` against one process on the same recorded job (issue 34).

The replay benchmark's shapes (`bench_replay_scale.py`: one data-parallel group over every
rank, or the 3D MoE job), recorded once per size, then replayed alternately by one process
and with the node stages in 1, 2, ... worker processes. Reported per way: wall seconds
(median), operations per second, the speed-up over one process, the CPU seconds of all its
processes, the largest peak RSS among them, and whether its output is byte for byte the one
process's (it must be: the same findings whatever the number of workers).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_replay_scale import SHAPES, simulate  # noqa: E402

from streams.core import native  # noqa: E402


def diagnose(recorded: Path, workers: int) -> tuple[float, float, int, str]:
    """Wall s, CPU s of all its processes, the largest peak RSS of them (KiB), the output's
    digest."""
    extra = ["--workers", str(workers)] if workers else []
    started = time.perf_counter()
    child = subprocess.Popen(  # noqa: S603 -- this interpreter, our own command
        [sys.executable, "-m", "c4.cli", "diagnose", *extra, str(recorded)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    out = child.stdout.read() if child.stdout is not None else b""
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        message = f"c4 diagnose {' '.join(extra)} failed (status {status})"
        raise RuntimeError(message)
    # The workers are the reading process's children, reaped (joined) before it exits:
    # wait4 counts their time in (Linux: the child's and its waited-for children's).
    cpu = usage.ru_utime + usage.ru_stime
    return seconds, cpu, usage.ru_maxrss, hashlib.sha256(out).hexdigest()[:12]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="dp", choices=sorted(SHAPES))
    parser.add_argument("--ranks", default="4096")
    parser.add_argument("--duration-s", type=float, default=12.0, help="event time")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ways = [0, *(int(each) for each in args.workers.split(","))]
    print(
        f"shape {args.shape}, {args.duration_s:.0f} s of event time, medians of {args.repeats};"
        f" detection core: {native.build_status()}; {os.cpu_count()} cores"
    )
    print(
        f"{'ranks':>7}{'ops':>11}  {'way':<14}{'wall s':>8}{'ops/s':>10}{'x one':>7}"
        f"{'CPU s':>7}{'RSS MiB':>9}  output"
    )
    with tempfile.TemporaryDirectory(prefix="c4-bench-spread-") as tmp:
        for ranks in (int(each) for each in args.ranks.split(",")):
            recorded, _, operations, _ = simulate(Path(tmp), args.shape, ranks, args.duration_s)
            runs: dict[int, list[tuple[float, float, int, str]]] = {way: [] for way in ways}
            for _ in range(args.repeats):  # alternately: the noise hits all
                for way in ways:
                    runs[way].append(diagnose(recorded, way))
            one = statistics.median(run[0] for run in runs[0])
            expected = runs[0][0][3]
            for way in ways:
                wall = statistics.median(run[0] for run in runs[way])
                cpu = statistics.median(run[1] for run in runs[way])
                rss = max(run[2] for run in runs[way]) / 1024
                digests = {run[3] for run in runs[way]}
                same = "same" if digests == {expected} else f"DIFFERS {sorted(digests)}"
                name = "one process" if not way else f"--workers {way}"
                print(
                    f"{ranks:>7}{operations:>11,}  {name:<14}{wall:>8.2f}"
                    f"{operations / wall:>10,.0f}{one / wall:>7.2f}{cpu:>7.1f}{rss:>9.0f}  {same}"
                )
            recorded.unlink()
    print(
        "CPU s: user + system time of the reading process and its workers; RSS: the largest"
        " of them; output: byte for byte the one process's"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
