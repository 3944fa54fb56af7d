"""The 3D-parallel C4D suite: Megatron-style and MoE jobs, their faults and healthy traps.

    python bench/scenario_suite_3d.py [--cases 300] [--seed 1] [--max-nodes 16] [--workers 2]

Simulates every case (producers.simulator.suite3d), replays it through a fresh engine as
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenario_suite import run_case  # noqa: E402
from producers.simulator.scoring import format_table, score_case  # noqa: E402
from producers.simulator.suite3d import Case, generate_3d_suite  # noqa: E402

MIN_PRECISION = 0.99
MIN_RECALL = 0.95


def _one(case: Case) -> dict[str, object]:
    started = time.perf_counter()
    truths, findings, _ = run_case(case.scenario)
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
    }


def _pct(values: list[int], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] / 1e9:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--verbose", action="store_true", help="list misses and false findings")
    args = parser.parse_args()
    started = time.perf_counter()
    work = generate_3d_suite(args.cases, args.seed, args.max_nodes)
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_one, work))
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    latencies: dict[str, list[int]] = defaultdict(list)
    traps: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    classes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for result in results:
        found = result["found"]
        assert isinstance(found, list)  # noqa: S101
        if result["healthy"]:
            traps[str(result["kind"])][0] += 1
            traps[str(result["kind"])][1] += len(result["findings"])  # type: ignore[arg-type]
        else:
            kinds[str(result["kind"])][0] += int(result["faults"])  # type: ignore[call-overload]
            kinds[str(result["kind"])][1] += len(found)
            latencies[str(result["kind"])] += found
        for cls, true in result["findings"]:  # type: ignore[attr-defined]
            classes[cls][0] += 1
            classes[cls][1] += int(true)
        if args.verbose and (result["false"] or result["missed"]):
            print(f"{result['name']} {result['kind']}: missed {result['missed']} "
                  f"false {result['false']}", file=sys.stderr)
    rows = [("fault kind", "faults", "recall@1", "p50 s", "p95 s", "max s")]
    problems = []
    for kind in sorted(kinds):
        faults, hit = kinds[kind]
        recall = hit / faults if faults else 0.0
        lat = latencies[kind]
        pcts = (_pct(lat, 0.5), _pct(lat, 0.95), _pct(lat, 1))
        rows.append((kind, str(faults), f"{recall:.3f}", *pcts))
        if recall < MIN_RECALL:
            problems.append(f"recall of {kind} {recall:.3f} < {MIN_RECALL}")
    rows.append(("diagnosis class", "findings", "precision", "", "", ""))
    for cls in sorted(classes):
        total, true = classes[cls]
        rows.append((cls, str(total), f"{true / total:.3f}", "", "", ""))
        if true / total < MIN_PRECISION:
            problems.append(f"precision of {cls} {true / total:.3f} < {MIN_PRECISION}")
    rows.append(("healthy trap", "runs", "findings", "", "", ""))
    for trap in sorted(traps):
        runs, findings = traps[trap]
        rows.append((trap, str(runs), str(findings), "", "", ""))
        if findings:
            problems.append(f"{findings} findings on healthy {trap} runs")
    seconds = sorted(float(r["seconds"]) for r in results)  # type: ignore[arg-type]
    print(
        f"{len(results)} 3D cases, seed {args.seed}, up to {args.max_nodes} nodes, "
        f"{time.perf_counter() - started:.0f} s ({args.workers} workers, "
        f"median {seconds[len(seconds) // 2]:.1f} s a case)"
    )
    print(format_table(rows))
    for problem in problems:
        print(f"target missed: {problem}")
    print("all targets met" if not problems else f"{len(problems)} targets missed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
