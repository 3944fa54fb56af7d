"""The 3D-parallel C4D suite: Megatron-style and MoE jobs, their faults and healthy traps.

    python bench/scenario_suite_3d.py [--cases 300] [--seed 1] [--max-nodes 16] [--workers 2]

Simulates every case (simulator.suite3d), replays it through a fresh engine as
`c4 diagnose` does and scores it as `c4 score` does: per fault kind recall at top-1 suspect
and detection latency (event time from onset), per diagnosis class precision, per healthy
trap the findings. Targets: recall >= 0.95 for every kind, precision >= 0.99, no finding on
any healthy trap. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenario_suite import run_case  # noqa: E402
from schemas.codec import encode  # noqa: E402
from simulator.scoring import format_table, score_case  # noqa: E402
from simulator.suite3d import Case, generate_3d_suite  # noqa: E402

MIN_PRECISION = 0.99
MIN_RECALL = 0.95


def _one(case: Case, node_stages: int = 0) -> dict[str, Any]:
    started = time.perf_counter()
    truths, findings, _ = run_case(case.scenario, node_stages)
    # With node stages, the case through one detector too: the same findings, byte for byte?
    same = not node_stages or [encode(f) for f in run_case(case.scenario)[1]] == [
        encode(f) for f in findings
    ]
    score = score_case(truths, findings)
    firing = [f for f in findings if f.state == "firing"]
    matched = {id(f) for _, f in score.matched_findings}
    return {
        "name": case.scenario.name,
        "kind": case.kind,
        "healthy": case.healthy,
        "faults": len(truths),
        "found": sorted(score.found.values()),
        "findings": [(f.class_, id(f) in matched) for f in firing],
        "false": [
            f"{f.class_} {f.suspects[0].id if f.suspects else '-'} {f.job}"
            for f in score.false_findings
        ],
        "missed": [t.suspect_id for t in score.missed],
        "seconds": time.perf_counter() - started,
        "same": same,
    }


def _pct(values: list[int], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] / 1e9:.1f}"


@dataclass(slots=True)
class Summary3D:
    """Per fault kind recall and latency, per class precision, per healthy trap findings."""

    kinds: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    latencies: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    traps: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    classes: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)  # through node stages: not the same

    def add(self, result: dict[str, Any]) -> None:
        """Fold one case's result in."""
        if not result.get("same", True):
            self.differing.append(str(result["name"]))
        kind = str(result["kind"])
        if result["healthy"]:
            self.traps[kind][0] += 1
            self.traps[kind][1] += len(result["findings"])
        else:
            self.kinds[kind][0] += int(result["faults"])
            self.kinds[kind][1] += len(result["found"])
            self.latencies[kind] += result["found"]
        for cls, true in result["findings"]:
            self.classes[cls][0] += 1
            self.classes[cls][1] += int(true)
        self.seconds.append(float(result["seconds"]))
        if result["false"] or result["missed"]:
            self.notes.append(
                f"{result['name']} {kind}: missed {result['missed']} false {result['false']}"
            )

    def rows(self) -> list[tuple[str, ...]]:
        """The table, kinds then classes then traps."""
        rows = [("fault kind", "faults", "recall@1", "p50 s", "p95 s", "max s")]
        for kind in sorted(self.kinds):
            faults, hit = self.kinds[kind]
            lat = self.latencies[kind]
            pcts = (_pct(lat, 0.5), _pct(lat, 0.95), _pct(lat, 1))
            rows.append((kind, str(faults), f"{hit / faults if faults else 0:.3f}", *pcts))
        rows.append(("diagnosis class", "findings", "precision", "", "", ""))
        for cls in sorted(self.classes):
            total, true = self.classes[cls]
            rows.append((cls, str(total), f"{true / total:.3f}", "", "", ""))
        rows.append(("healthy trap", "runs", "findings", "", "", ""))
        for trap in sorted(self.traps):
            runs, findings = self.traps[trap]
            rows.append((trap, str(runs), str(findings), "", "", ""))
        return rows

    def problems(self) -> list[str]:
        """The targets missed, one line each."""
        found = []
        for kind, (faults, hit) in sorted(self.kinds.items()):
            if faults and hit / faults < MIN_RECALL:
                found.append(f"recall of {kind} {hit / faults:.3f} < {MIN_RECALL}")
        for cls, (total, true) in sorted(self.classes.items()):
            if true / total < MIN_PRECISION:
                found.append(f"precision of {cls} {true / total:.3f} < {MIN_PRECISION}")
        for trap, (_, findings) in sorted(self.traps.items()):
            if findings:
                found.append(f"{findings} findings on healthy {trap} runs")
        return found


def run_3d_suite(
    cases: int, seed: int, max_nodes: int, workers: int, node_stages: int = 0
) -> Summary3D:
    """Every case of the 3D suite, scored and folded into one summary (with
    ``node_stages``, the reports through that many node stages, each case also compared
    with one detector's findings)."""
    work = generate_3d_suite(cases, seed, max_nodes)
    summary = Summary3D()
    stages = [node_stages] * len(work)
    if workers <= 1:
        results = [_one(case, n) for case, n in zip(work, stages, strict=True)]
    else:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_one, work, stages))
    for result in results:
        summary.add(result)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--verbose", action="store_true", help="list misses and false findings")
    parser.add_argument(
        "--node-stages",
        type=int,
        default=0,
        help="the reports through N node stages; each case also through one detector, and"
        " a case whose findings differ is a missed target",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    summary = run_3d_suite(args.cases, args.seed, args.max_nodes, args.workers, args.node_stages)
    if args.verbose:
        for note in summary.notes:
            print(note, file=sys.stderr)
    seconds = sorted(summary.seconds)
    print(
        f"{len(seconds)} 3D cases, seed {args.seed}, up to {args.max_nodes} nodes, "
        f"{time.perf_counter() - started:.0f} s ({args.workers} workers, "
        f"median {seconds[len(seconds) // 2]:.1f} s a case)"
    )
    print(format_table(summary.rows()))
    problems = summary.problems()
    if args.node_stages:
        print(
            f"{args.node_stages} node stages: findings the same as one detector's, byte for"
            f" byte, in {len(seconds) - len(summary.differing)} of {len(seconds)} cases"
        )
        problems += [f"{name}: findings differ from one detector's" for name in summary.differing]
    for problem in problems:
        print(f"target missed: {problem}")
    print("all targets met" if not problems else f"{len(problems)} targets missed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
