"""The demo's verdict (pure): per injected fault, its diagnosis, detection latency and actions.

A fault is diagnosed when a firing finding matches it as the scorer matches them (class, top-1
suspect, job, after the onset); it is acted on when an action that changes something
(isolate, restart, reroute) recorded ``done`` for one of its findings. The run passes only
when every fault is both, and no firing finding matches no fault.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from c4.action_notes import ActionNote, note
from schemas.messages import Action, Diagnosis
from simulator.scoring import matches
from simulator.truth import Truth

CHANGING = frozenset({"isolate", "restart", "reroute"})
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Row:
    """One injected fault and what the system made of it."""

    truth: Truth
    finding: Diagnosis | None  # the first matching firing finding
    findings: tuple[Diagnosis, ...]  # every matching firing finding
    actions: tuple[ActionNote, ...]

    @property
    def latency_ns(self) -> int | None:
        """Detection latency in event time (finding ts - fault onset)."""
        if self.finding is None:
            return None
        return max(0, self.finding.ts_ns - self.truth.onset_ns)

    @property
    def acted(self) -> bool:
        """Whether an isolate, restart or reroute was done for it."""
        return any(a.action in CHANGING and a.status == "done" for a in self.actions)

    @property
    def ok(self) -> bool:
        """Diagnosed and acted on."""
        return self.finding is not None and self.acted


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every fault's row, and the firing findings that match no fault."""

    start_ns: int
    rows: tuple[Row, ...]
    false_findings: tuple[Diagnosis, ...]

    @property
    def passed(self) -> bool:
        """Every fault diagnosed and acted on, and no false finding."""
        return all(row.ok for row in self.rows) and not self.false_findings


def build_timeline(
    start_ns: int,
    truths: Iterable[Truth],
    diagnoses: Iterable[Diagnosis],
    actions: Iterable[Action],
) -> Timeline:
    """Match findings to faults and actions to findings."""
    truths = sorted(truths, key=lambda t: (t.onset_ns, t.fault))
    firing = sorted(
        (d for d in _unique(diagnoses) if d.state == "firing"), key=lambda d: (d.ts_ns, d.id)
    )
    by_diagnosis: dict[str, list[Action]] = {}
    for action in sorted(actions, key=lambda a: (a.ts_ns, a.id)):
        if action.diagnosis is not None:
            by_diagnosis.setdefault(action.diagnosis, []).append(action)
    rows = []
    matched: set[str] = set()
    for truth in truths:
        found = tuple(d for d in firing if matches(truth, d))
        matched.update(d.id for d in found)
        notes = tuple(
            note(a) for d in found for a in by_diagnosis.get(d.id, ()) if a.action != "release"
        )
        rows.append(Row(truth, found[0] if found else None, found, notes))
    false = tuple(d for d in firing if d.id not in matched)
    return Timeline(start_ns, tuple(rows), false)


def _unique(diagnoses: Iterable[Diagnosis]) -> list[Diagnosis]:
    seen: dict[tuple[str, str], Diagnosis] = {}
    for diagnosis in diagnoses:
        seen.setdefault((diagnosis.id, diagnosis.state), diagnosis)
    return list(seen.values())


def seconds(ns: int | None) -> str:
    """Nanoseconds as seconds with one decimal (``-`` for none)."""
    return "-" if ns is None else f"{ns / NS_PER_S:.1f}"


def table(timeline: Timeline) -> list[tuple[str, ...]]:
    """The timeline as rows of text cells (header first); an action per line, skipped
    actions left out."""
    out: list[tuple[str, ...]] = [
        ("at s", "injected fault", "culprit", "diagnosis", "suspect", "latency s", "actions")
    ]
    for row in timeline.rows:
        truth, finding = row.truth, row.finding
        at = seconds(truth.onset_ns - timeline.start_ns)
        diagnosis = finding.class_ if finding else "MISSED"
        suspect = finding.suspects[0].id if finding and finding.suspects else "-"
        # A skipped action changed nothing (the node was isolated already, the job had moved
        # off it): the audit files keep it, the table counts it in `skipped_line`.
        taken = [a for a in row.actions if a.status != "skipped"]
        shown = [a.text for a in taken if a.action in CHANGING] or ["(no action done)"]
        alerts = [a for a in taken if a.action == "alert"]
        if alerts:
            done = sum(1 for a in alerts if a.status == "done")
            shown.append(f"{done}/{len(alerts)} alerts delivered")
        first = (at, truth.type, truth.suspect_id, diagnosis, suspect, seconds(row.latency_ns))
        out.append((*first, shown[0]))
        out.extend(("", "", "", "", "", "", more) for more in shown[1:])
    for finding in timeline.false_findings:
        suspect = finding.suspects[0].id if finding.suspects else "-"
        at = seconds(finding.ts_ns - timeline.start_ns)
        out.append((at, "(none)", "-", f"FALSE {finding.class_}", suspect, "-", finding.job or ""))
    return out


def skipped_line(timeline: Timeline) -> str | None:
    """One line counting the skipped actions the table leaves out, by reason (None: none)."""
    reasons = Counter(
        str(a.detail.get("reason", "no reason"))
        for row in timeline.rows
        for a in row.actions
        if a.status == "skipped"
    )
    if not reasons:
        return None
    total = sum(reasons.values())
    said = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    noun = "action" if total == 1 else "actions"
    return f"{total} skipped {noun} not shown ({said}); all actions are in actions.jsonl"


def format_rows(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows as an aligned text table with a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(timeline: Timeline) -> str:
    """One line: how many faults were diagnosed and acted on, false findings."""
    diagnosed = sum(1 for row in timeline.rows if row.finding is not None)
    acted = sum(1 for row in timeline.rows if row.ok)
    total = len(timeline.rows)
    state = "PASS" if timeline.passed else "FAIL"
    return (
        f"{state}: {diagnosed}/{total} faults diagnosed, {acted}/{total} acted on, "
        f"{len(timeline.false_findings)} false findings"
    )
