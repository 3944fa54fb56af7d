"""The C4D scenario suite: simulate many cases, diagnose them, score against ground truth.

    python bench/scenario_suite.py [--cases 300] [--seed 1] [--sizes 8,64,256,1024]

Prints per fault type recall at top-1 suspect and detection latency percentiles (event
time from onset), per diagnosis class precision, and findings on healthy runs, against the
issue's targets (precision >= 0.99, recall >= 0.95, zero findings on healthy runs). Exits 1
when a target is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas.codec import encode  # noqa: E402
from schemas.messages import Diagnosis  # noqa: E402
from simulator import generate_suite, ground_truth  # noqa: E402
from simulator.cluster import build_cluster  # noqa: E402
from simulator.run import simulate_cluster  # noqa: E402
from simulator.scenario import Scenario  # noqa: E402
from simulator.scoring import (  # noqa: E402
    SuiteSummary,
    format_table,
    score_case,
)
from simulator.truth import Truth  # noqa: E402
from streams.core.engine import Engine  # noqa: E402
from streams.core.spread import SpreadDetection  # noqa: E402
from streams.replay import Replayed  # noqa: E402

MIN_PRECISION = 0.99
MIN_RECALL = 0.95
MAX_STRAGGLER_OPS = 50


def iteration_ns(engine: Engine, job: str) -> float | None:
    """The median time between operations of a job's largest communicator (an iteration)."""
    detector = engine.jobs.get(job)
    if detector is None or not detector.comms:
        return None
    largest = max(detector.comms.values(), key=lambda tracker: tracker.size)
    return largest.periods.median()


def run_case(
    scenario: Scenario, node_stages: int = 0
) -> tuple[list[Truth], list[Diagnosis], Engine]:
    """Simulate one scenario, replay it through a fresh engine (with ``node_stages``, the
    collective reports through that many node stages: `streams.core.spread`); (truths,
    findings, engine)."""
    cluster = build_cluster(None, scenario)
    truths = ground_truth(None, scenario, cluster)
    engine = Engine(topology=cluster.topology)
    stage: Replayed = engine if not node_stages else SpreadDetection(engine, node_stages)
    findings: list[Diagnosis] = []
    for message in simulate_cluster(cluster, scenario):
        findings.extend(stage.on_message(message))
    findings.extend(stage.on_eof())
    return truths, findings, engine


def run_suite(
    cases: int,
    seed: int,
    sizes: tuple[int, ...],
    verbose: bool = False,
    node_stages: int = 0,
    differing: list[str] | None = None,
) -> SuiteSummary:
    """Every case of the suite, scored and folded into one summary. With ``node_stages``
    the reports go through that many node stages; with ``differing`` as well, each case is
    also replayed through one detector and named there when the findings are not the same,
    byte for byte."""
    summary = SuiteSummary()
    for scenario in generate_suite(cases, seed, sizes):
        truths, findings, engine = run_case(scenario, node_stages)
        if differing is not None and node_stages:
            alone = run_case(scenario)[1]
            if [encode(d) for d in alone] != [encode(d) for d in findings]:
                differing.append(scenario.name)
        score = score_case(truths, findings)
        summary.add(truths, score, findings)
        for truth in truths:
            period = iteration_ns(engine, truth.job) if truth.job else None
            if truth.type == "slow_gpu" and truth.fault in score.found and period:
                summary.straggler_ops.append(score.found[truth.fault] / period)
        if verbose and (score.missed or score.false_findings):
            for truth in score.missed:
                print(f"{scenario.name}: missed {truth.fault} {truth.suspect_id}", file=sys.stderr)
            for finding in score.false_findings:
                top = finding.suspects[0].id if finding.suspects else "-"
                print(
                    f"{scenario.name}: false {finding.class_} {top} job={finding.job}",
                    file=sys.stderr,
                )
    return summary


def missed_targets(summary: SuiteSummary) -> list[str]:
    """The targets the summary misses, one line each."""
    problems = []
    for kind, faults in summary.faults.items():
        recall = summary.found[kind] / faults
        if recall < MIN_RECALL:
            problems.append(f"recall of {kind} {recall:.3f} < {MIN_RECALL}")
    for cls, total in summary.findings_by_class.items():
        precision = summary.true_by_class[cls] / total
        if precision < MIN_PRECISION:
            problems.append(f"precision of {cls} {precision:.3f} < {MIN_PRECISION}")
    if summary.healthy_findings:
        problems.append(f"{summary.healthy_findings} findings on healthy runs")
    if summary.straggler_ops and max(summary.straggler_ops) > MAX_STRAGGLER_OPS:
        problems.append(f"a straggler took {max(summary.straggler_ops):.0f} operations to name")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sizes", default="8,64,256,1024")
    parser.add_argument("--verbose", action="store_true", help="list misses and false findings")
    parser.add_argument(
        "--node-stages",
        type=int,
        default=0,
        help="the reports through N node stages; each case also through one detector, and"
        " a case whose findings differ is a missed target",
    )
    args = parser.parse_args()
    sizes = tuple(int(size) for size in args.sizes.split(","))
    started = time.perf_counter()
    differing: list[str] = []
    summary = run_suite(args.cases, args.seed, sizes, args.verbose, args.node_stages, differing)
    stages = f", {args.node_stages} node stages" if args.node_stages else ""
    print(
        f"{summary.cases} cases, seed {args.seed}, sizes {args.sizes}{stages}, "
        f"{time.perf_counter() - started:.0f} s"
    )
    if args.node_stages:
        print(
            f"findings the same as one detector's, byte for byte: "
            f"{summary.cases - len(differing)} of {summary.cases} cases"
        )
    print(format_table(summary.rows()))
    if summary.straggler_ops:
        ops = sorted(summary.straggler_ops)
        print(
            f"straggler named after {ops[len(ops) // 2]:.0f} operations (median), "
            f"{ops[-1]:.0f} at most (target {MAX_STRAGGLER_OPS})"
        )
    problems = missed_targets(summary)
    problems += [f"{name}: findings differ from one detector's" for name in differing]
    for problem in problems:
        print(f"target missed: {problem}")
    print("all targets met" if not problems else f"{len(problems)} targets missed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
