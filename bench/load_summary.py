"""bench_load's closing report: each fault's detection latency, the figures and the verdicts
("lag bounded", "memory flat", "every fault found")."""

from __future__ import annotations

import argparse
import math
import os
import statistics

from bench_streams import OPS_PER_MESSAGE, RANKS, SLACK_S, S
from load_measure import Run, Sample

from streams.core.params import DetectorParams


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def window(samples: list[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.elapsed < end] or samples[-1:]


def summary(run: Run, args: argparse.Namespace, jobs: int, grace_end: float) -> list[str]:
    samples = run.samples
    first, last = run.row_samples[0], run.row_samples[-1]  # at the first and the last row
    zero = samples[0]
    span = max(last.elapsed - zero.elapsed, 1e-9)
    bench_cores = (last.bench_cpu - zero.bench_cpu) / span
    busy = (last.busy - zero.busy) / span
    duration = args.duration_s
    rate = jobs * RANKS
    lines = ["", f"{'#':>2} {'fault':<13} {'job':<9} {'onset_s':>7} {'latency_s':>9}  suspect"]
    latencies = []
    named, nameable = 0, 0  # faults found with the expected top suspect, of those with one
    for fault in run.faults:
        if fault.number not in run.injected_at:
            continue
        onset = run.injected_at[fault.number]
        expected = fault.expected_suspect()
        if fault.number in run.found:
            wall, top = run.found[fault.number]
            latencies.append(wall - onset)
            nameable += expected is not None
            named += expected is not None and top == expected
            verdict = "" if expected is None else (" (ok)" if top == expected else " (WRONG)")
            shown = f"{wall - onset:9.2f}  {top}{verdict}"
        else:
            shown = f"{'MISSED':>9}  expected {expected or '-'}"
        lines.append(
            f"{fault.number:2d} {fault.kind:<13} {fault.job:<9} {onset - run.t0:7.0f} {shown}"
        )
    injected = len(run.injected_at)
    half = [s for s in samples if s.elapsed >= duration / 2] or samples[-1:]
    mid = window(samples, duration / 2 - args.row_s, duration / 2)
    end = window(samples, duration - args.row_s, duration + 1)
    bound = round(args.lag_bound_s * rate)
    lag_max_half = max(s.lag_group for s in half)
    lag_mid = statistics.mean(s.lag_group for s in mid)
    lag_end = statistics.mean(s.lag_group for s in end)
    lag_ok = lag_max_half <= bound and lag_end <= lag_mid + bound / 10
    # Levels, not peaks: a leak raises the mean; a passing spike shows in the peak.
    rss_mid = statistics.mean(s.rss for s in mid)
    rss_end = statistics.mean(s.rss for s in end)
    growth = (rss_end - rss_mid) / rss_mid if rss_mid else math.inf
    # All that reached the broker over the time it took to send (duration_s when on time).
    achieved = run.produced / max(duration, run.published_s)
    consumed = (last.consumed - zero.consumed) / span
    late = (last.late - zero.late) / span
    found = len(run.found)
    recovering = sum(1 for f in run.faults if f.recover_s < duration and f.number in run.found)
    met = {True: "met", False: "MISSED"}
    target = DetectorParams().hang_after_ns(None) / S + SLACK_S
    p50 = f"{statistics.median(latencies):.2f}" if latencies else "-"
    p99 = f"{percentile(latencies, 0.99):.2f}" if latencies else "-"
    figures = [
        (
            "offered",
            f"{rate:,} msg/s ({jobs} jobs x {RANKS} ranks x 1 report/s, "
            f"{OPS_PER_MESSAGE} ops each; asked {args.rate:,})",
        ),
        (
            "produced (broker log end)",
            f"{achieved:,.0f} msg/s; producer behind schedule at most {run.behind_s:.1f} s",
        ),
        (
            "consumed (worker counters)",
            f"{consumed:,.0f} msg/s taken, {late:,.0f} msg/s dropped as too late "
            f"({last.late:,.0f} in all)",
        ),
        (
            "faults found",
            f"{found} of {injected} (by {grace_end:.0f} s), top suspect right in {named} of "
            f"{nameable}; resolved after recovery: "
            f"{len(run.resolved)} of {recovering}; other findings: {len(run.others)}"
            + (f" {run.others[:3]}" if run.others else ""),
        ),
        ("detection latency p50 / p99", f"{p50} / {p99} s"),
        (
            "lag (group) first/last/max",
            f"{first.lag_group:,} / {last.lag_group:,}"
            f" / {max(s.lag_group for s in samples):,} records",
        ),
        (
            "lag (worker gauge) last/max",
            f"{last.lag_worker:,.0f} / {max(s.lag_worker for s in samples):,.0f}",
        ),
        (
            "worker RSS first/last/max",
            f"{first.rss:.0f} / {last.rss:.0f} / {max(s.rss for s in samples):.0f} MiB",
        ),
        ("worker RSS second half", f"{rss_mid:.0f} -> {rss_end:.0f} MiB ({growth:+.1%})"),
        (
            "CPU cores used (mean)",
            f"worker {(last.cpu - zero.cpu) / span:.2f}, bench {bench_cores:.2f}, the rest "
            f"(broker, other users) {busy - (last.cpu - zero.cpu) / span - bench_cores:.2f}, "
            f"of {os.cpu_count()}",
        ),
        (
            "bench RSS first/last/max",
            f"{first.bench_rss:.0f} / {last.bench_rss:.0f}"
            f" / {max(s.bench_rss for s in samples):.0f} MiB",
        ),
        (
            "lag bounded",
            f"{met[lag_ok]}: max in the second half {lag_max_half:,} <= "
            f"{bound:,} ({args.lag_bound_s:.0f} s of input), and mean of the last {args.row_s} s "
            f"{lag_end:,.0f} <= mean of the {args.row_s} s before mid-run {lag_mid:,.0f} + "
            f"{bound / 10:,.0f} (no growth)",
        ),
        (
            "memory flat",
            f"{met[growth < args.memory_growth]}: worker RSS growth over the "
            f"second half {growth:+.1%} < {args.memory_growth:.0%} (mean of the last {args.row_s}"
            f" s against mean of the {args.row_s} s before mid-run)",
        ),
        (
            "detection latency",
            f"{met[bool(latencies) and percentile(latencies, 0.99) <= target]}: p99 {p99} s <= "
            f"{target:.1f} s (hang_after + 3 s, issue #4's hang target, for every kind here)",
        ),
        ("every fault found", f"{met[injected > 0 and found == injected]}: {found} of {injected}"),
    ]
    width = max(len(name) for name, _ in figures)
    lines.append("")
    lines.extend(f"{name:<{width}}  {value}" for name, value in figures)
    return lines
