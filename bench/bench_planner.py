"""C4P against ECMP: max link utilisation, job bus bandwidth, planning and replanning time.

Fabrics of 64, 256 and 1024 nodes x 8 dual-port NICs (200G ports, one per plane), 2 planes,
8 nodes per leaf, 32 spines per plane at 400G (1:1). Jobs get random nodes; each runs ring
allreduce (one ring per NIC port) or a permutation, every flow at line rate. ECMP draws a
random source port per flow and hashes it (crc32) at the source leaf, over many seeds.
The max-min fair model of `planner.eval.evaluation` turns paths into each job's bus
bandwidth (Gbps per ring; line rate 200). Then the most loaded fabric link fails: ECMP's
groups shrink, the plan is replanned incrementally (and, for comparison, with mode "best":
widened repair, full replan only if strictly better), and both are evaluated again. Last,
the C4 paper's concurrent-allreduce setting as far as the model goes, beside its figures.

Targets: plan at the lower bound on every collision-free-feasible case; 8,192 flows planned
in < 1 s; a single link failure replanned in < 50 ms moving only the flows that used it.

    .venv/bin/python bench/bench_planner.py [--quick] [--out FILE]

The full run writes its output to bench/results/planner.txt as well; --quick only prints.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import lower_bound, moved_flows, plan, replan, replan_choice  # noqa: E402
from planner.eval.evaluation import Comparison, compare  # noqa: E402
from planner.eval.traffic import PATTERNS, Pattern, Workload, workload  # noqa: E402
from schemas.files import Plan  # noqa: E402
from topology.ecmp import hash_model  # noqa: E402
from topology.generate import Shape, generate  # noqa: E402
from topology.model import Fabric  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "planner.txt"
TARGET_FLOWS, TARGET_PLAN_S, TARGET_REPLAN_S = 8192, 1.0, 0.050
CLOSE = 1e-9
T = TypeVar("T")


@dataclass(frozen=True)
class Sizes:
    sizes: tuple[int, ...]
    jobs: tuple[int, ...]
    util_seeds: int
    rate_seeds: dict[int, int]
    repeats: dict[int, int]


FULL = Sizes((64, 256, 1024), (1, 4, 16), 100, {64: 20, 256: 20, 1024: 8}, {64: 7, 256: 5, 1024: 3})
QUICK = Sizes((64, 256), (1, 16), 20, {64: 5, 256: 3}, {64: 3, 256: 3})


@dataclass(frozen=True)
class Row:
    nodes: int
    pattern: str
    jobs: int
    flows: int
    ecmp_mean: float
    ecmp_p99: float
    planned: float
    bound: float
    ecmp_bw: float
    ecmp_bw_min: float
    plan_bw: float
    plan_bw_min: float
    plan_s: float
    peak_mib: float
    # After the most loaded fabric link fails:
    failed: str
    crossing: int
    moved: int
    only_crossing: bool
    replan_s: float
    replanned: float
    fresh: float
    bound_down: float
    ecmp_down_mean: float
    ecmp_down_bw: float
    replan_bw: float
    # mode="best": incremental, then widened repair, then a full replan if strictly better
    best: float
    best_moved: int
    best_strategy: str
    best_s: float


def timed(repeats: int, call: Callable[[], T]) -> tuple[float, T]:
    """Median wall time of ``repeats`` calls after a warm-up call (collector on)."""
    times = []
    result = call()
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def peak_mib(call: Callable[[], object]) -> float:
    """Peak Python memory of one call (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    call()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def p99(values: tuple[float, ...]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def busiest_link(result: Plan) -> tuple[str, int]:
    """The fabric link the most flows cross (both directions), and how many."""
    count = Counter(link for path in result.paths if path.via for link in path.links[1:3])
    link, flows = min(count.items(), key=lambda item: (-item[1], item[0]))
    return link, flows


def bandwidths(comparison: Comparison) -> tuple[float, float, float, float]:
    ecmp = [r.busbw_gbps for jobs in comparison.ecmp_jobs for r in jobs]
    planned = [r.busbw_gbps for r in comparison.plan_jobs]
    return statistics.mean(ecmp), min(ecmp), statistics.mean(planned), min(planned)


def run_case(fabric: Fabric, nodes: int, pattern: Pattern, jobs: int, settings: Sizes) -> Row:
    load: Workload = workload(fabric, pattern, jobs, seed=nodes + jobs)
    flows = load.flows
    repeats = settings.repeats[nodes]
    plan_s, result = timed(repeats, lambda: plan(fabric, flows))
    memory = peak_mib(lambda: plan(fabric, flows))
    bound = lower_bound(fabric, flows)
    model = hash_model("crc32")
    util_seeds = range(settings.util_seeds)
    rate_seeds = range(settings.rate_seeds[nodes])
    healthy = compare(fabric, load, result, model, util_seeds, rate_seeds)
    failed, crossing = busiest_link(result)
    replan_s, after = timed(repeats, lambda: replan(fabric, result, flows, [failed]))
    moved = moved_flows(result, after)
    crossed = {path.flow for path in result.paths if failed in path.links}
    fresh = plan(fabric, flows, [failed]).max_util
    broken = compare(fabric, load, after, model, util_seeds, rate_seeds, [failed])
    best_s, chosen = timed(
        repeats, lambda: replan_choice(fabric, result, flows, [failed], mode="best")
    )
    ecmp_bw, ecmp_min, plan_bw, plan_min = bandwidths(healthy)
    return Row(
        nodes=nodes,
        pattern=pattern,
        jobs=jobs,
        flows=len(flows.flows),
        ecmp_mean=statistics.mean(healthy.ecmp_max_util),
        ecmp_p99=p99(healthy.ecmp_max_util),
        planned=result.max_util,
        bound=bound,
        ecmp_bw=ecmp_bw,
        ecmp_bw_min=ecmp_min,
        plan_bw=plan_bw,
        plan_bw_min=plan_min,
        plan_s=plan_s,
        peak_mib=memory,
        failed=failed,
        crossing=crossing,
        moved=len(moved),
        only_crossing=set(moved) == crossed,
        replan_s=replan_s,
        replanned=after.max_util,
        fresh=fresh,
        bound_down=lower_bound(fabric, flows, [failed]),
        ecmp_down_mean=statistics.mean(broken.ecmp_max_util),
        ecmp_down_bw=bandwidths(broken)[0],
        replan_bw=bandwidths(broken)[2],
        best=chosen.plan.max_util,
        best_moved=len(chosen.moved),
        best_strategy=chosen.strategy,
        best_s=best_s,
    )


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return lines


def report(
    rows: list[Row],
    planning: list[tuple[str, bool]],
    settings: Sizes,
    started: float,
    paper: list[str],
) -> tuple[list[str], bool]:
    out = [
        "C4P planner vs ECMP (crc32 hash, random source ports)",
        f"run {datetime.now(tz=UTC):%Y-%m-%d %H:%M} UTC, python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cpus; ECMP over {settings.util_seeds} seeds "
        "(max_util) and "
        + "/".join(str(settings.rate_seeds[n]) for n in settings.sizes)
        + " seeds (busbw)",
        "fabric: N nodes x 8 NICs x 2 ports (200G, one per plane), 8 nodes per leaf, "
        "32 spines per plane at 400G",
        "busbw: Gbps per ring (line rate 200), mean over jobs and seeds (worst job)",
        "",
        "healthy fabric",
    ]
    out += table(
        [
            "nodes",
            "traffic",
            "jobs",
            "flows",
            "ECMP mean",
            "ECMP p99",
            "plan",
            "bound",
            "busbw ECMP",
            "busbw plan",
            "gain",
            "plan ms",
            "peak MiB",
        ],
        [
            [
                str(r.nodes),
                r.pattern,
                str(r.jobs),
                str(r.flows),
                f"{r.ecmp_mean:.2f}",
                f"{r.ecmp_p99:.2f}",
                f"{r.planned:.2f}",
                f"{r.bound:.2f}",
                f"{r.ecmp_bw:.0f} ({r.ecmp_bw_min:.0f})",
                f"{r.plan_bw:.0f} ({r.plan_bw_min:.0f})",
                f"{r.plan_bw / r.ecmp_bw:.2f}x",
                f"{r.plan_s * 1e3:.0f}",
                f"{r.peak_mib:.1f}",
            ]
            for r in rows
        ],
    )
    out += [
        "",
        "after the most loaded fabric link fails: the default replan moves only its flows; "
        "mode best may move more (widened repair, or a full replan if strictly better)",
    ]
    out += table(
        [
            "nodes",
            "traffic",
            "jobs",
            "failed link",
            "crossing",
            "moved",
            "replan ms",
            "replan",
            "full plan",
            "bound",
            "ECMP mean",
            "busbw ECMP",
            "busbw replan",
            "best",
            "best moved",
            "best via",
            "best ms",
        ],
        [
            [
                str(r.nodes),
                r.pattern,
                str(r.jobs),
                r.failed,
                str(r.crossing),
                f"{r.moved}{'' if r.only_crossing else ' (!)'}",
                f"{r.replan_s * 1e3:.1f}",
                f"{r.replanned:.2f}",
                f"{r.fresh:.2f}",
                f"{r.bound_down:.2f}",
                f"{r.ecmp_down_mean:.2f}",
                f"{r.ecmp_down_bw:.0f}",
                f"{r.replan_bw:.0f}",
                f"{r.best:.2f}",
                str(r.best_moved),
                r.best_strategy,
                f"{r.best_s * 1e3:.1f}",
            ]
            for r in rows
        ],
    )
    at_bound = sum(abs(r.planned - r.bound) <= CLOSE for r in rows)
    slowest = max(rows, key=lambda r: r.replan_s)
    only = sum(r.only_crossing for r in rows)
    bound_met = at_bound == len(rows)
    replan_met = slowest.replan_s < TARGET_REPLAN_S and only == len(rows)
    below = [r for r in rows if r.replanned > r.bound_down + CLOSE]
    reached = sum(r.best <= r.bound_down + CLOSE for r in below)
    extra = [r.best_moved - r.moved for r in below]
    out.append(
        f"  incremental above the bound in {len(below)}/{len(rows)} cases; mode best reaches "
        f"it in {reached}/{len(below)}, moving {min(extra, default=0)}-{max(extra, default=0)} "
        "more flows than the incremental replan"
    )
    out += paper
    out += ["", "targets"]
    out.append(
        "  plan at the lower bound on every collision-free-feasible case (all cases above: "
        f"equal flows, 1:1 fabric): {at_bound}/{len(rows)} {_verdict(bound_met)}"
    )
    out += [line for line, _ in planning]
    out.append(
        f"  single link failure replanned in < {TARGET_REPLAN_S * 1e3:.0f} ms moving only its "
        f"flows, all cases above: slowest {slowest.replan_s * 1e3:.1f} ms ({slowest.flows} "
        f"flows), only its flows moved in {only}/{len(rows)}: {_verdict(replan_met)}"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.append(f"benchmark wall time {time.perf_counter() - started:.0f} s, peak RSS {rss:.0f} MiB")
    return out, bound_met and replan_met and all(met for _, met in planning)


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def target_flows(repeats: int) -> list[tuple[str, bool]]:
    """Exactly 8,192 flows: 512 nodes x 8 NICs x 2 ports, one flow per port; plan, then fail
    the most loaded fabric link and replan."""
    fabric = Fabric.from_topology(generate(Shape(nodes=512, spines=32)))
    lines = []
    for pattern in PATTERNS:
        load = workload(fabric, pattern, 1, seed=5)
        flows = load.flows
        assert len(flows.flows) == TARGET_FLOWS  # noqa: S101 - the shape says so
        seconds, result = timed(repeats, lambda: plan(fabric, flows))  # noqa: B023 - used now
        met = seconds < TARGET_PLAN_S
        lines.append(
            (
                f"  {TARGET_FLOWS:,} flows planned in < {TARGET_PLAN_S:.0f} s ({pattern}, 512 "
                f"nodes): {seconds * 1e3:.0f} ms, median of {repeats}; max_util "
                f"{result.max_util:.2f}, bound {lower_bound(fabric, flows):.2f}: {_verdict(met)}",
                met,
            )
        )
        failed, _ = busiest_link(result)
        seconds, after = timed(
            repeats,
            lambda: replan(fabric, result, flows, [failed]),  # noqa: B023 - used now
        )
        crossed = sorted(path.flow for path in result.paths if failed in path.links)
        moved = sorted(moved_flows(result, after))
        only = moved == crossed
        met = seconds < TARGET_REPLAN_S and only
        lines.append(
            (
                f"  {TARGET_FLOWS:,} flows, {failed} down, replanned in < "
                f"{TARGET_REPLAN_S * 1e3:.0f} ms moving only its flows ({pattern}): "
                f"{seconds * 1e3:.1f} ms, moved {len(moved)}, crossing it {len(crossed)}"
                f"{'' if only else ' (others moved!)'}: {_verdict(met)}",
                met,
            )
        )
    model = hash_model("crc32")
    seconds, _ = timed(repeats, lambda: plan(fabric, flows, hash_model=model))
    lines.append(
        (f"  (with --hash crc32, a source port searched per flow: {seconds * 1e3:.0f} ms)", True)
    )
    return lines


PAPER_NODES, PAPER_JOBS, PAPER_QPS = 128, (8, 16), (1, 2, 4)
PAPER_NOTES = (
    "paper (Dong et al., C4, HPCA 2025, arXiv 2406.04594), cited cautiously:",
    "  - ECMP collisions: a ~30% gap between achieved and ideal throughput (22B model, 512 "
    "GPUs; as summarised from the paper)",
    "  - production jobs: about 15% lower communication cost / better runtime for some "
    "applications (abstract)",
    "  - concurrent allreduce test (8-16 jobs): busbw gains of roughly 50-70%, about 70.3% in "
    "one setting (figures from the issue brief; not verified against the paper text here)",
    "what the model ignores: congestion control (DCQCN), PFC and packet-level dynamics, the",
    "  paper's 3-tier fabric, NIC bonding, jobs' compute phases and start times (every ring",
    "  sends at line rate at once), intra-leaf hops (random placement: every hop crosses a",
    "  spine); ECMP draws one source port per flow for the whole run. The fabric is fully",
    "  loaded by design, so these gains bound from above what planning recovers on such",
    "  traffic; more queue pairs per hop (smaller flows, more draws) shrink ECMP's loss.",
)


def paper_setting(seeds: int) -> list[str]:
    """The C4 paper's allreduce test as far as the model goes: 8 and 16 concurrent ring
    allreduce jobs on a shared 1:1 fabric, ECMP against the plan, per queue pairs per hop."""
    fabric = Fabric.from_topology(generate(Shape(nodes=PAPER_NODES, spines=32)))
    model = hash_model("crc32")
    rows = []
    for jobs in PAPER_JOBS:
        for qps in PAPER_QPS:
            load = workload(fabric, "ring", jobs, seed=7 + jobs, qps=qps)
            result = plan(fabric, load.flows)
            comparison = compare(fabric, load, result, model, [], range(seeds))
            ecmp_bw, ecmp_min, plan_bw, plan_min = bandwidths(comparison)
            rows.append(
                [
                    str(jobs),
                    str(PAPER_NODES // jobs),
                    str(qps),
                    str(len(load.flows.flows)),
                    f"{result.max_util:.2f}",
                    f"{ecmp_bw:.0f} ({ecmp_min:.0f})",
                    f"{plan_bw:.0f} ({plan_min:.0f})",
                    f"{1 - ecmp_bw / 200:.0%}",
                    f"+{plan_bw / ecmp_bw - 1:.0%}",
                ]
            )
    out = [
        "",
        f"the C4 paper's setting, as far as the model allows: concurrent ring-allreduce jobs "
        f"on one shared fabric of {PAPER_NODES} nodes (as above), random placement, ECMP over "
        f"{seeds} seeds",
    ]
    out += table(
        [
            "jobs",
            "nodes/job",
            "QPs/hop",
            "flows",
            "plan",
            "busbw ECMP",
            "busbw plan",
            "ECMP loss",
            "plan gain",
        ],
        rows,
    )
    return out + list(PAPER_NOTES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller fabrics, fewer seeds")
    parser.add_argument("--out", help="also write the output here (full run default: results)")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    started = time.perf_counter()
    rows = []
    for nodes in settings.sizes:
        fabric = Fabric.from_topology(generate(Shape(nodes=nodes, spines=32)))
        for pattern in PATTERNS:
            for jobs in settings.jobs:
                row = run_case(fabric, nodes, pattern, jobs, settings)
                print(
                    f"  {nodes} nodes {pattern} {jobs} jobs: plan {row.planned:.2f} "
                    f"ECMP {row.ecmp_mean:.2f}",
                    file=sys.stderr,
                )
                rows.append(row)
    paper = paper_setting(5 if args.quick else 20)
    lines, met = report(rows, target_flows(3 if args.quick else 5), settings, started, paper)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    target = args.out or (None if args.quick else str(RESULTS))
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text, encoding="utf-8")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
