"""Score diagnoses against a simulator's ground truth: recall, precision, latency, false alarms.

A finding matches an injected fault when its class is one the fault may be found as, its
top suspect is the fault's culprit, its job is the fault's (or the fault is fabric-wide) and
it fired after the onset. Every firing finding that matches no fault is a false finding.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas.messages import Diagnosis
from simulator.truth import Truth

# Findings may conclude from evidence gathered up to one reporting interval before onset.
ONSET_SLACK_NS = 1_000_000_000


@dataclass(slots=True)
class CaseScore:
    """The result of one scenario."""

    found: dict[str, int] = field(default_factory=dict)  # fault -> detection latency (ns)
    missed: list[Truth] = field(default_factory=list)
    false_findings: list[Diagnosis] = field(default_factory=list)
    matched_findings: list[tuple[Truth, Diagnosis]] = field(default_factory=list)


def matches(truth: Truth, finding: Diagnosis) -> bool:
    """Whether a firing finding names this fault (class, top-1 suspect, job, time)."""
    if finding.class_ not in truth.classes or not finding.suspects:
        return False
    if finding.suspects[0].id != truth.suspect_id:
        return False
    if truth.job is not None and finding.job not in (truth.job, None):
        return False
    return finding.ts_ns + ONSET_SLACK_NS >= truth.onset_ns


def score_case(truths: Iterable[Truth], findings: Iterable[Diagnosis]) -> CaseScore:
    """Match one scenario's firing findings to its faults."""
    truths = list(truths)
    score = CaseScore()
    for finding in findings:
        if finding.state != "firing":
            continue
        hits = [t for t in truths if matches(t, finding)]
        if not hits:
            score.false_findings.append(finding)
            continue
        for truth in hits:
            score.matched_findings.append((truth, finding))
            latency = max(0, finding.ts_ns - truth.onset_ns)
            score.found[truth.fault] = min(score.found.get(truth.fault, latency), latency)
    score.missed = [t for t in truths if t.fault not in score.found]
    return score


@dataclass(slots=True)
class SuiteSummary:
    """Per fault type: recall, precision, latency percentiles; false findings on healthy runs."""

    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    found: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    latencies: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    findings_by_class: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    true_by_class: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    straggler_ops: list[float] = field(default_factory=list)  # iterations until named
    healthy_runs: int = 0
    healthy_findings: int = 0
    cases: int = 0

    def add(self, truths: list[Truth], score: CaseScore, findings: list[Diagnosis]) -> None:
        """Fold one scored scenario in."""
        self.cases += 1
        if not truths:
            self.healthy_runs += 1
            self.healthy_findings += sum(1 for f in findings if f.state == "firing")
        for truth in truths:
            self.faults[truth.type] += 1
            if truth.fault in score.found:
                self.found[truth.type] += 1
                self.latencies[truth.type].append(score.found[truth.fault])
        matched = {id(f) for _, f in score.matched_findings}
        for finding in findings:
            if finding.state != "firing":
                continue
            self.findings_by_class[finding.class_] += 1
            if id(finding) in matched:
                self.true_by_class[finding.class_] += 1

    def rows(self) -> list[tuple[str, ...]]:
        """The table: one row per fault type, then one per diagnosis class."""
        out: list[tuple[str, ...]] = [
            ("fault type", "faults", "recall@1", "p50 s", "p95 s", "max s")
        ]
        for kind in sorted(self.faults):
            lat = sorted(self.latencies[kind])
            out.append(
                (
                    kind,
                    str(self.faults[kind]),
                    f"{self.found[kind] / self.faults[kind]:.3f}",
                    _pct(lat, 0.5),
                    _pct(lat, 0.95),
                    _pct(lat, 1.0),
                )
            )
        out.append(("diagnosis class", "findings", "precision", "", "", ""))
        for cls in sorted(self.findings_by_class):
            total = self.findings_by_class[cls]
            out.append((cls, str(total), f"{self.true_by_class[cls] / total:.3f}", "", "", ""))
        out.append(
            (
                "healthy runs",
                str(self.healthy_runs),
                f"{self.healthy_findings} findings",
                "",
                "",
                "",
            )
        )
        return out


def _pct(values: list[int], q: float) -> str:
    if not values:
        return "-"
    index = min(len(values) - 1, int(q * (len(values) - 1) + 0.5))
    return f"{values[index] / 1e9:.1f}"


def format_table(rows: list[tuple[str, ...]]) -> str:
    """Rows as an aligned text table."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )
