"""What ``c4 demo --slurm`` measured (pure): per injected fault, what c4 and Slurm showed and
when; the summary figures against the detector's bounds; the table and the JSON report.

Every time is the demo's wall clock (``time.time_ns()``) at the poll that first saw it,
except a finding's ``ts_ns``, which the streams worker stamped (event time: the ranks' own
clocks, here the same machine's). Slurm is polled every `POLL_S`, so a figure is good to
about that much.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from streams.core.params import DetectorParams

NS_PER_S = 1_000_000_000
POLL_S = 0.1
# The drain is due this long after the detector's own bound (a finding is published, the
# action worker claims it, isolates in Redis and drains through scontrol).
ACT_MARGIN_S = 3.0
HANG_CLASSES = frozenset({"node_down", "noncomm_hang"})
STRAGGLER_CLASSES = frozenset({"noncomm_slow"})

FaultKind = Literal["hang", "straggler"]


@dataclass(slots=True)
class FaultRecord:
    """One injected fault and what followed it (None: not seen)."""

    kind: FaultKind
    culprit: str  # the node whose ranks were stopped or throttled
    pids: tuple[int, ...]
    injected_ns: int
    restarts_before: int
    diagnosis_id: str | None = None
    diagnosis: str | None = None  # its class
    suspect: str | None = None
    diagnosis_ts_ns: int | None = None
    drained_ns: int | None = None
    reason: str | None = None  # the drain reason as ``sinfo -R -o %E`` prints it (in full)
    sinfo_line: str | None = None  # ``sinfo -R``'s own line (it cuts the reason at 20)
    requeued_ns: int | None = None  # first seen requeued by Slurm (left RUNNING, count up)
    running_ns: int | None = None  # first seen RUNNING again, restart count up
    restarts: int | None = None  # ``scontrol show job``'s Restarts= then
    job_state: str = ""
    nodes_after: tuple[str, ...] = ()
    released: str = ""  # what ``c4 state release`` said, when the node was given back
    problem: str = ""

    @property
    def latency_ns(self) -> int | None:
        """Detection latency: the finding's ts_ns - the injection."""
        if self.diagnosis_ts_ns is None:
            return None
        return max(0, self.diagnosis_ts_ns - self.injected_ns)

    @property
    def to_drain_ns(self) -> int | None:
        """Injection to the node seen drained."""
        return None if self.drained_ns is None else self.drained_ns - self.injected_ns

    @property
    def drained_to_running_ns(self) -> int | None:
        """Node seen drained to the job seen running again."""
        if self.drained_ns is None or self.running_ns is None:
            return None
        return self.running_ns - self.drained_ns

    @property
    def requeue_to_running_ns(self) -> int | None:
        """Slurm's part: the job seen requeued to seen running again."""
        if self.requeued_ns is None or self.running_ns is None:
            return None
        return self.running_ns - self.requeued_ns

    @property
    def found(self) -> bool:
        """A finding of the expected class named the culprit's node."""
        return self.diagnosis is not None

    @property
    def acted(self) -> bool:
        """Drained with c4's reason, requeued, running again off the node."""
        return (
            self.reason is not None
            and self.reason.startswith("c4:")
            and self.restarts is not None
            and self.restarts > self.restarts_before
            and self.running_ns is not None
            and self.culprit not in self.nodes_after
        )

    @property
    def ok(self) -> bool:
        """Found and acted on."""
        return self.found and self.acted and not self.problem

    def as_dict(self) -> dict[str, Any]:
        """The record with its derived figures (seconds), for the JSON report."""
        out = asdict(self)
        for name in ("latency", "to_drain", "drained_to_running", "requeue_to_running"):
            out[f"{name}_s"] = seconds(getattr(self, f"{name}_ns"))
        out["ok"] = self.ok
        return out


@dataclass(frozen=True, slots=True)
class FalseFinding:
    """A firing finding of the job that names no injected fault, and what was done about it."""

    id: str
    cls: str
    suspect: str
    at_ns: int  # since the job started running
    actions: tuple[str, ...]  # ``isolate node-002/gpu0 done``, ``restart 1 failed (...)``
    drained: bool  # an isolate done: a healthy node drained

    def text(self) -> str:
        """One line: class, suspect, when, what was done."""
        done = "; ".join(self.actions) or "no action"
        return f"{self.cls} {self.suspect} at {self.at_ns / NS_PER_S:.1f} s ({self.id}): {done}"


@dataclass(frozen=True, slots=True)
class JobEnd:
    """The job as ``scontrol show job`` reported it at the end."""

    job_id: str
    state: str
    exit_code: str
    restarts: int
    nodes: str

    @property
    def completed(self) -> bool:
        """COMPLETED with exit code 0:0."""
        return self.state == "COMPLETED" and self.exit_code == "0:0"


@dataclass(frozen=True, slots=True)
class Bounds:
    """The detector's bounds a hang is found within (its defaults), plus `ACT_MARGIN_S`."""

    silent_after_s: float
    hang_min_s: float
    margin_s: float = ACT_MARGIN_S

    @classmethod
    def defaults(cls) -> Bounds:
        """`streams.core.params.DetectorParams`' defaults, as the demo's streams worker runs."""
        params = DetectorParams()
        return cls(params.silent_after_ns / NS_PER_S, params.hang_min_ns / NS_PER_S)

    def target_s(self, cls: str | None) -> float:
        """When the drain is due after the stop: a node_down (the node's every rank silent)
        fires after ``silent_after``, a noncomm_hang after ``hang_min`` (or the hang factor
        times the median op, when that is longer)."""
        bound = self.silent_after_s if cls == "node_down" else self.hang_min_s
        return bound + self.margin_s


@dataclass(frozen=True, slots=True)
class Spread:
    """The median and the worst of some durations (seconds), and how many."""

    p50_s: float | None
    worst_s: float | None
    count: int

    @classmethod
    def of(cls, values_ns: Sequence[int | None]) -> Spread:
        values = [v / NS_PER_S for v in values_ns if v is not None]
        if not values:
            return cls(None, None, 0)
        return cls(round(statistics.median(values), 3), round(max(values), 3), len(values))

    def text(self) -> str:
        """``p50 4.1 s, worst 4.6 s`` (``-`` when nothing was measured)."""
        if self.p50_s is None or self.worst_s is None:
            return "not measured"
        return f"p50 {self.p50_s:.1f} s, worst {self.worst_s:.1f} s"


@dataclass(frozen=True, slots=True)
class Figures:
    """The summary over the run's faults."""

    hang_to_drain: Spread
    hang_targets_s: tuple[float, ...]  # per hang, by the class that found it
    hangs_within: bool
    drained_to_running: Spread
    requeue_to_running: Spread
    straggler_latency_s: float | None
    straggler_to_drain_s: float | None
    bounds: Bounds = field(default_factory=Bounds.defaults)


def figures(records: Sequence[FaultRecord], bounds: Bounds) -> Figures:
    """Hang to drain (p50, worst, each against its target), drained to running and Slurm's
    requeue to running over every fault acted on, the straggler's latency."""
    hangs = [r for r in records if r.kind == "hang"]
    targets = tuple(bounds.target_s(r.diagnosis) for r in hangs)
    within = bool(hangs) and all(
        r.to_drain_ns is not None and r.to_drain_ns / NS_PER_S <= target
        for r, target in zip(hangs, targets, strict=True)
    )
    stragglers = [r for r in records if r.kind == "straggler"]
    latency = stragglers[0].latency_ns if stragglers else None
    to_drain = stragglers[0].to_drain_ns if stragglers else None
    return Figures(
        hang_to_drain=Spread.of([r.to_drain_ns for r in hangs]),
        hang_targets_s=targets,
        hangs_within=within,
        drained_to_running=Spread.of([r.drained_to_running_ns for r in records]),
        requeue_to_running=Spread.of([r.requeue_to_running_ns for r in records]),
        straggler_latency_s=None if latency is None else round(latency / NS_PER_S, 3),
        straggler_to_drain_s=None if to_drain is None else round(to_drain / NS_PER_S, 3),
        bounds=bounds,
    )


def passed(records: Sequence[FaultRecord], end: JobEnd | None) -> bool:
    """Every fault found and acted on, and the job completed (exit 0)."""
    return bool(records) and all(r.ok for r in records) and end is not None and end.completed


def seconds(ns: int | None) -> float | None:
    """Nanoseconds as seconds (3 decimals), None kept."""
    return None if ns is None else round(ns / NS_PER_S, 3)


def _cell(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / NS_PER_S:.1f}"


def table(
    records: Sequence[FaultRecord], started_ns: int, others: Sequence[FalseFinding] = ()
) -> list[tuple[str, ...]]:
    """The timeline as rows of text cells, header first: one row per fault, then one per
    false finding (what was done about it in the reason column)."""
    out: list[tuple[str, ...]] = [
        (
            "at s",
            "injected fault",
            "culprit",
            "diagnosis",
            "suspect",
            "latency s",
            "to drain s",
            "drained->running s",
            "requeue->running s",
            "drain reason (sinfo -R)",
            "restarts",
            "job",
        )
    ]
    for record in records:
        fault = "SIGSTOP every rank" if record.kind == "hang" else "SIGSTOP 30 ms of 100"
        out.append(
            (
                _cell(record.injected_ns - started_ns),
                f"{record.kind}: {fault}",
                record.culprit,
                record.diagnosis or "MISSED",
                record.suspect or "-",
                _cell(record.latency_ns),
                _cell(record.to_drain_ns),
                _cell(record.drained_to_running_ns),
                _cell(record.requeue_to_running_ns),
                record.reason or "(not drained)",
                "-" if record.restarts is None else str(record.restarts),
                record.job_state or "-",
            )
        )
    for other in others:
        out.append(
            (
                _cell(other.at_ns),
                "(none)",
                "-",
                f"FALSE {other.cls}",
                other.suspect,
                *("-",) * 4,
                "; ".join(other.actions) or "(no action)",
                "-",
                "-",
            )
        )
    return out


def summary_lines(
    records: Sequence[FaultRecord],
    found: Figures,
    end: JobEnd | None,
    others: Sequence[FalseFinding],
) -> list[str]:
    """The figures in words, then the verdict line."""
    bounds = found.bounds
    hangs = [r for r in records if r.kind == "hang"]
    lines = [
        f"hang to drain: {found.hang_to_drain.text()} over {found.hang_to_drain.count} of "
        f"{len(hangs)} hangs; target {bounds.target_s('node_down'):.1f} s for a node_down "
        f"(silent_after {bounds.silent_after_s:g} s + {bounds.margin_s:g} s: every rank of the "
        f"node stopped, its reporting too), {bounds.target_s('noncomm_hang'):.1f} s for a "
        f"noncomm_hang (hang_min {bounds.hang_min_s:g} s + {bounds.margin_s:g} s): "
        + ("within" if found.hangs_within else "NOT within"),
        f"drained to running again: {found.drained_to_running.text()}; of which Slurm's "
        f"requeue to running: {found.requeue_to_running.text()} "
        f"(over {found.drained_to_running.count} requeues)",
    ]
    if found.straggler_latency_s is not None:
        drain = found.straggler_to_drain_s
        lines.append(
            f"straggler: named after {found.straggler_latency_s:.1f} s of throttling"
            + ("" if drain is None else f", its node drained after {drain:.1f} s")
        )
    elif any(r.kind == "straggler" for r in records):
        lines.append("straggler: NOT named")
    lines.extend(f"FALSE finding: {other.text()}" for other in others)
    if end is not None:
        lines.append(
            f"job {end.job_id}: {end.state}, exit code {end.exit_code}, "
            f"{end.restarts} restarts, last on {end.nodes or '-'}"
        )
    found_n = sum(1 for r in records if r.found)
    acted_n = sum(1 for r in records if r.ok)
    completed = end is not None and end.completed
    state = "PASS" if passed(records, end) else "FAIL"
    drained = sum(1 for other in others if other.drained)
    lines.append(
        f"{state}: {found_n}/{len(records)} faults found, {acted_n}/{len(records)} acted on "
        f"(drained with c4's reason, requeued, running off the node), job "
        + ("completed" if completed else "NOT completed")
        + f"; {len(others)} false findings"
        + (f", {drained} of them drained a healthy node" if drained else "")
    )
    return lines


def report(
    run_id: str,
    records: Sequence[FaultRecord],
    found: Figures,
    end: JobEnd | None,
    others: Sequence[FalseFinding],
    started_ns: int,
) -> dict[str, Any]:
    """Everything the table and the summary say, as one JSON-ready document."""
    spreads = {
        "hang_to_drain": found.hang_to_drain,
        "drained_to_running": found.drained_to_running,
        "requeue_to_running": found.requeue_to_running,
    }
    return {
        "run": run_id,
        "job_started_ns": started_ns,
        "faults": [record.as_dict() for record in records],
        "figures": {
            **{name: asdict(spread) for name, spread in spreads.items()},
            "hang_targets_s": list(found.hang_targets_s),
            "hangs_within_target": found.hangs_within,
            "straggler_latency_s": found.straggler_latency_s,
            "straggler_to_drain_s": found.straggler_to_drain_s,
            "bounds": asdict(found.bounds),
            "poll_s": POLL_S,
        },
        "false_findings": [{**asdict(other), "at_s": seconds(other.at_ns)} for other in others],
        "job": None if end is None else {**asdict(end), "completed": end.completed},
        "passed": passed(records, end),
    }
