"""Findings: fire once with a stable id, resolve once, as v1 diagnosis messages."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas.messages import Diagnosis, DiagnosisClass, Suspect, SuspectType


@dataclass(frozen=True, slots=True)
class SuspectScore:
    """One suspect of a finding, before it becomes a v1 ``Suspect``."""

    type: SuspectType
    id: str
    score: float


def finding_id(job: str | None, cls: str, key: str, onset_ns: int) -> str:
    """A stable id: the same finding recomputed (replay, restarted worker) gets the same id."""
    digest = hashlib.sha256(f"{job}|{cls}|{key}|{onset_ns}".encode()).hexdigest()
    return f"d-{digest[:16]}"


@dataclass(slots=True)
class OpenFinding:
    """A finding that has fired and not resolved yet."""

    id: str
    job: str | None
    cls: DiagnosisClass
    onset_ns: int
    suspects: tuple[SuspectScore, ...]
    evidence: dict[str, Any] = field(default_factory=dict)
    # The detectors' time when it fired: a check at an earlier time (a worker restored from
    # a snapshot replays the records before it) cannot end it.
    fired_ns: int = 0


def to_diagnosis(finding: OpenFinding, state: str, ts_ns: int) -> Diagnosis:
    """The v1 diagnosis message of a finding in the given state."""
    return Diagnosis(
        v=1,
        kind="diagnosis",
        id=finding.id,
        job=finding.job,
        state="firing" if state == "firing" else "resolved",
        class_=finding.cls,
        onset_ns=finding.onset_ns,
        ts_ns=max(ts_ns, finding.onset_ns),
        suspects=tuple(
            Suspect(type=s.type, id=s.id, score=round(min(1.0, max(0.0, s.score)), 4))
            for s in finding.suspects
        ),
        evidence=finding.evidence,
    )


# A hang seen again on the same suspects this soon after its finding resolved (event time)
# is that finding still: the same id and onset, so an action keyed by it is not taken twice
# (a requeued job's last reports, read after the restart closed the finding).
REOPEN_WITHIN_NS = 60_000_000_000
REOPENED_CLASSES = frozenset({"noncomm_hang", "comm_hang"})


class FindingBook:
    """Open findings by (job, class, key): fire on change only, resolve when the condition ends."""

    def __init__(self) -> None:
        self._open: dict[tuple[str | None, str, str], OpenFinding] = {}
        # Hangs resolved lately, with when: one that fires again on the same suspects soon
        # after is the same finding.
        self._closed: dict[tuple[str | None, str, str], tuple[OpenFinding, int]] = {}

    def inherit(self, other: FindingBook) -> None:
        """Take the hangs another book (the job's run before a restart) closed lately."""
        self._closed.update(other._closed)

    def _remember(self, identity: tuple[str | None, str, str], f: OpenFinding, at: int) -> None:
        if f.cls in REOPENED_CLASSES:
            self._closed[identity] = (f, at)

    def is_open(self, job: str | None, cls: str, key: str) -> bool:
        """Whether a finding with this identity is firing now."""
        return (job, cls, key) in self._open

    def fire(
        self,
        job: str | None,
        cls: DiagnosisClass,
        key: str,
        onset_ns: int,
        now_ns: int,
        suspects: tuple[SuspectScore, ...],
        evidence: dict[str, Any],
    ) -> Diagnosis | None:
        """Open a finding; None when the same one is already open (emit on change only)."""
        if (job, cls, key) in self._open:
            return None
        fid = finding_id(job, cls, key, onset_ns)
        closed = self._closed.pop((job, cls, key), None)
        if closed is not None:
            before, resolved_ns = closed
            same = [s.id for s in before.suspects] == [s.id for s in suspects]
            if same and 0 <= now_ns - resolved_ns <= REOPEN_WITHIN_NS:
                fid, onset_ns = before.id, before.onset_ns  # the same fault, still there
        finding = OpenFinding(fid, job, cls, onset_ns, suspects, evidence, now_ns)
        self._open[(job, cls, key)] = finding
        return to_diagnosis(finding, "firing", now_ns)

    def fire_into(
        self,
        out: list[Diagnosis],
        job: str | None,
        cls: DiagnosisClass,
        key: str,
        onset_ns: int,
        now_ns: int,
        suspects: tuple[SuspectScore, ...],
        evidence: dict[str, Any],
    ) -> None:
        """`fire`, adding the diagnosis (if any) to ``out``."""
        fired = self.fire(job, cls, key, onset_ns, now_ns, suspects, evidence)
        if fired is not None:
            out.append(fired)

    def resolve(self, job: str | None, cls: str, key: str, now_ns: int) -> Diagnosis | None:
        """Close a finding; None when it is not open, or when ``now_ns`` is before it fired:
        what was seen before a finding fired does not end it (a restored worker replaying the
        records before its snapshot would resolve it, then fire it again)."""
        finding = self._open.get((job, cls, key))
        if finding is None or now_ns < finding.fired_ns:
            return None
        del self._open[(job, cls, key)]
        self._remember((job, cls, key), finding, now_ns)
        return to_diagnosis(finding, "resolved", now_ns)

    def resolve_all(self, now_ns: int) -> list[Diagnosis]:
        """Close every open finding."""
        closed = [to_diagnosis(f, "resolved", now_ns) for f in self._open.values()]
        for identity, finding in self._open.items():
            self._remember(identity, finding, now_ns)
        self._open.clear()
        return closed

    def open_findings(self) -> list[OpenFinding]:
        """Every finding firing now."""
        return list(self._open.values())

    def state(self, belongs: Callable[[str], bool] | None = None) -> list[list[Any]]:
        """The open findings as plain data; ``belongs`` picks them by key."""
        return [
            [
                job,
                cls,
                key,
                f.id,
                f.onset_ns,
                [[s.type, s.id, s.score] for s in f.suspects],
                f.evidence,
                f.fired_ns,
            ]
            for (job, cls, key), f in self._open.items()
            if belongs is None or belongs(key)
        ]

    def restore(self, state: list[list[Any]]) -> None:
        """Open again the findings of a snapshot (they were published before it was taken).
        A snapshot written before findings kept their firing time has seven fields: the
        onset stands in for it."""
        for job, cls, key, fid, onset_ns, suspects, evidence, *fired in state:
            self._open[(job, cls, key)] = OpenFinding(
                fid,
                job,
                cls,
                onset_ns,
                tuple(SuspectScore(*s) for s in suspects),
                evidence,
                int(fired[0]) if fired else onset_ns,
            )

    def drop(self, belongs: Callable[[str], bool]) -> None:
        """Forget (without resolving) the open findings whose key ``belongs``."""
        for identity in [i for i in self._open if belongs(i[2])]:
            del self._open[identity]

    def finding(self, job: str | None, cls: str, key: str) -> OpenFinding | None:
        """The open finding of one job, class and key; None when none is open."""
        return self._open.get((job, cls, key))

    def open_keys(self, job: str | None, cls: str) -> list[str]:
        """Keys of the open findings of one job and class."""
        return [key for (j, c, key) in self._open if j == job and c == cls]
