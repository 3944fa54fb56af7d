"""``c4 score``: compare diagnoses with a simulator's ground truth, one line per fault."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import orjson

from c4 import C4Error
from c4.inputs import read_input
from schemas.codec import Rejection, decode
from schemas.messages import Diagnosis
from simulator.scoring import score_case
from simulator.truth import Truth

if TYPE_CHECKING:
    from c4.settings import Settings


class ScoreError(C4Error):
    """A truth or diagnosis file is unusable."""


def _lines(path: str) -> list[bytes]:
    return [line for line in read_input(path).splitlines() if line.strip()]


def load_truths(path: str) -> list[Truth]:
    """The ground-truth lines written by `c4 simulate`."""
    truths = []
    for number, line in enumerate(_lines(path), start=1):
        try:
            truths.append(Truth.from_dict(orjson.loads(line)))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            message = f"{path} line {number}: not a ground-truth line ({error})"
            raise ScoreError(message) from error
    return truths


def load_diagnoses(path: str) -> list[Diagnosis]:
    """The v1 diagnoses written by `c4 diagnose` (or consumed from c4.diagnosis.v1)."""
    found = []
    for number, line in enumerate(_lines(path), start=1):
        result = decode(line, "diagnosis")
        if isinstance(result, Rejection):
            message = f"{path} line {number}: {result.reason}"
            raise ScoreError(message)
        assert isinstance(result, Diagnosis)  # noqa: S101 - decode(kind="diagnosis")
        found.append(result)
    return found


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings
    truths = load_truths(args.truth)
    findings = load_diagnoses(args.diagnoses)
    score = score_case(truths, findings)
    for truth in truths:
        latency = score.found.get(truth.fault)
        verdict = f"found in {latency / 1e9:.1f} s" if latency is not None else "MISSED"
        print(f"{truth.fault:<26} {truth.suspect_id:<28} {verdict}")
    for finding in score.false_findings:
        top = finding.suspects[0].id if finding.suspects else "-"
        print(f"false finding: {finding.class_} {top} (job {finding.job})")
    ok = not score.missed and not score.false_findings
    print(f"{len(score.found)}/{len(truths)} faults found, {len(score.false_findings)} false")
    return 0 if ok else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``score`` subcommand."""
    parser = subparsers.add_parser(
        "score", help="compare diagnoses with a simulator's ground truth (exit 1 on a miss)"
    )
    parser.add_argument("--truth", required=True, help="ground truth from c4 simulate")
    parser.add_argument("diagnoses", help="JSON Lines of v1 diagnoses")
    parser.set_defaults(handler=_run)
