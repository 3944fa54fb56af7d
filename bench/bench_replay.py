"""Replay speed of ``c4 diagnose`` on a 3D-parallel MoE job, against an earlier commit's.

One recorded run of a Megatron-style job (tensor-parallel groups inside a node, a 1F1B
pipeline over point-to-point pairs, data-parallel rings over the NIC ports, expert
all-to-alls, one slowed GPU) is simulated once with this tree, then replayed by
``python -m c4.cli diagnose`` of this tree and of the baseline commit (exported with
``git archive``), alternately, ``--repeats`` times each; with the detection core built
(scripts/build_native.py), this tree runs compiled and once more as pure Python
(``C4_PURE_PYTHON=1``); the baseline runs as its own tree is, here pure Python. The same
file through ``c4 validate`` (the same decoder, no detection) is the ceiling any replay of
it can reach in this design. Prints operations/s and microseconds per operation (medians),
peak RSS, and the findings of each.

    python bench/bench_replay.py [--nodes 16] [--duration-s 60] [--baseline a021379]
                                 [--interval-s 1.0] [--batch]

``--interval-s 0.5`` makes about 10 operations per message (real reporting sizes);
``--batch`` also replays the same run as ``collectives`` records (one per job, node and
interval, as ``c4 agent --batch`` sends them) with this tree (the baseline reads only
single messages).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from streams.core import native  # noqa: E402 -- this tree's, whichever runs the bench

MIB = 1 << 20


def scenario(
    nodes: int, duration_s: float, interval_s: float = 1.0, jobs: int = 1
) -> dict[str, object]:
    """The recorded job (``jobs`` of them, each on its own ``nodes``): tp 8 inside each
    node, pp 4, the rest data and expert parallel; one GPU of the first slowed at 20 s."""
    pp = 4 if nodes % 4 == 0 else 1
    names = ["job-3d"] if jobs == 1 else [f"job-{j:02d}" for j in range(jobs)]
    return {
        "name": "bench-replay-3d",
        "seed": 11,
        "duration_s": duration_s,
        "interval_s": interval_s,
        "emit_routes": True,
        "fabric": {"nodes_per_leaf": 4, "spines": 4},
        "jobs": [
            {
                "id": name,
                "ranks": nodes * 8,
                "jitter": 0.01,
                "parallel": {
                    "tp": 8,
                    "pp": pp,
                    "ep": 2 if nodes // pp >= 2 else 1,
                    "microbatches": 8,
                    "forward_ms": 20.0,
                    "activation_bytes": 16 * MIB,
                    "tp_bytes": 8 * MIB,
                    "bucket_bytes": 50 * MIB,
                    "dp_buckets": 4,
                    "a2a_bytes": 4 * MIB,
                    "hot_expert_load": 0.6,
                    "gpu_spread": 0.02,
                },
            }
            for name in names
        ],
        "faults": [{"type": "slow_gpu", "job": names[0], "rank": 43, "at_s": 20.0, "factor": 1.3}],
    }


def simulate(
    folder: Path, nodes: int, duration_s: float, interval_s: float = 1.0, batch: bool = False
) -> tuple[Path, int, int]:
    """The recorded file, its messages and operations."""
    spec = folder / "scenario.json"
    spec.write_bytes(orjson.dumps(scenario(nodes, duration_s, interval_s)))
    out = folder / ("replay-batched.jsonl" if batch else "replay.jsonl")
    subprocess.run(  # noqa: S603 -- this interpreter, our own command
        [
            *(sys.executable, "-m", "c4.cli", "simulate", "--scenario", str(spec)),
            *("--out", str(out), *(["--batch"] if batch else [])),
        ],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    messages = operations = 0
    with out.open("rb") as lines:
        for line in lines:
            record = orjson.loads(line)
            inner = record.get("messages", ()) if record.get("kind") == "collectives" else ()
            for message in inner if inner else (record,):
                if message.get("kind") == "collective":
                    messages += 1
                    operations += len(message["ops"]["seq"])
    return out, messages, operations


def export(ref: str, folder: Path) -> Path:
    """The baseline's tree, as ``git archive`` writes it."""
    tree = folder / f"baseline-{ref}"
    archive = subprocess.run(  # noqa: S603 -- git on this repository
        ["git", "archive", "--format=tar", ref],  # noqa: S607 -- git from PATH, like a user
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


PURE = {"C4_PURE_PYTHON": "1"}  # the detection core as Python, not its compiled build
COMPILED: dict[str, str] = {}  # its compiled build: the default where one is current
CEILING = "decode only (c4 validate)"


def replay(
    tree: Path, recorded: Path, extra_env: dict[str, str] | None = None, command: str = "diagnose"
) -> tuple[float, int, list[str]]:
    """Wall seconds, peak RSS (KiB) and findings of one ``c4 diagnose`` run in ``tree``
    (``command`` "validate": decoding only, no findings)."""
    env = {**os.environ, "PYTHONPATH": str(tree), **(extra_env or {})}
    started = time.perf_counter()
    child = subprocess.Popen(  # noqa: S603 -- this interpreter, our own command
        [sys.executable, "-m", "c4.cli", command, str(recorded)],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    out = child.stdout.read() if child.stdout is not None else b""
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        message = f"c4 {command} in {tree} failed (status {status})"
        raise RuntimeError(message)
    if command != "diagnose":
        return seconds, usage.ru_maxrss, []
    findings = sorted(
        {
            f"{d['class']} {d['suspects'][0]['id'] if d['suspects'] else '-'}"
            for d in map(orjson.loads, out.splitlines())
            if d.get("state") == "firing"
        }
    )
    return seconds, usage.ru_maxrss, findings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="a021379", help="commit to compare against")
    parser.add_argument("--interval-s", type=float, default=1.0, help="reporting interval")
    parser.add_argument("--batch", action="store_true", help="also replay collectives batches")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="c4-bench-replay-") as tmp:
        folder = Path(tmp)
        recorded, messages, operations = simulate(
            folder, args.nodes, args.duration_s, args.interval_s
        )
        core = native.build_status()
        label = "this tree" if core == "compiled" else f"this tree, {core}"
        inputs: dict[str, tuple[Path, Path, dict[str, str]]] = {label: (ROOT, recorded, COMPILED)}
        if core == "compiled":
            inputs["this tree, pure Python"] = (ROOT, recorded, PURE)
        if args.batch:
            batched, *_ = simulate(folder, args.nodes, args.duration_s, args.interval_s, True)
            inputs[f"{label}, batches"] = (ROOT, batched, COMPILED)
            if core == "compiled":
                inputs["this tree, pure, batches"] = (ROOT, batched, PURE)
        inputs[f"baseline {args.baseline}"] = (export(args.baseline, folder), recorded, {})
        runs: dict[str, list[tuple[float, int, list[str]]]] = {name: [] for name in inputs}
        runs[CEILING] = []
        size = recorded.stat().st_size / MIB
        for _ in range(args.repeats):
            for name, (tree, data, env) in inputs.items():  # alternately: the noise hits all
                runs[name].append(replay(tree, data, env))
            runs[CEILING].append(replay(ROOT, recorded, command="validate"))
    print(
        f"{args.nodes * 8} ranks, {args.duration_s:.0f} s, {messages:,} collective messages, "
        f"{operations:,} operations ({operations / max(messages, 1):.1f} per message), "
        f"{size:.0f} MiB; {args.repeats} runs each"
    )
    print(f"{'replay':<30}{'ops/s (median)':>16}{'us/op':>8}{'peak RSS MiB':>14}  findings")
    medians = {}
    for name, results in runs.items():
        seconds = statistics.median(r[0] for r in results)
        medians[name] = seconds
        rss = max(r[1] for r in results) / 1024
        findings = "; ".join(results[0][2]) or ("-" if name == CEILING else "none")
        print(
            f"{name:<30}{operations / seconds:>16,.0f}{seconds / operations * 1e6:>8.2f}"
            f"{rss:>14.0f}  {findings}"
        )
    base = medians[f"baseline {args.baseline}"]
    for name, seconds in medians.items():
        if not name.startswith("baseline") and name != CEILING:
            print(f"{name} vs baseline: {base / seconds:.2f}x the baseline's speed per operation")
    ceiling = medians[CEILING]
    print(
        f"decoding alone (start-up included) runs {operations / ceiling:,.0f} ops/s: "
        f"this tree reaches {ceiling / medians[next(iter(medians))]:.0%} of it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
