from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from schemas.codec import encode
from streams.core.engine import Engine
from tests.unit.ring_job import T0, RingJob

TRUTH = {
    "fault": "process_stuck#0",
    "type": "process_stuck",
    "job": "job-1",
    "onset_ns": T0,
    "classes": ["noncomm_hang"],
    "suspect": {"type": "gpu", "id": "node-001/gpu3"},
}


def run_c4(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args], capture_output=True, text=True, timeout=60
    )


def diagnoses_of(job: RingJob, path: Path) -> None:
    engine = Engine()
    found = [d for m in [job.job_message(), *job.messages()] for d in engine.process(m)]
    path.write_bytes(b"".join(encode(d) + b"\n" for d in found))


def test_found_fault_exits_zero(tmp_path: Path) -> None:
    (tmp_path / "truth.jsonl").write_bytes(orjson.dumps(TRUTH) + b"\n")
    diagnoses_of(RingJob(stuck_rank={11: 40}), tmp_path / "d.jsonl")
    result = run_c4("score", "--truth", str(tmp_path / "truth.jsonl"), str(tmp_path / "d.jsonl"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/1 faults found, 0 false" in result.stdout


def test_missed_fault_or_false_finding_exits_one(tmp_path: Path) -> None:
    wrong = dict(TRUTH, suspect={"type": "gpu", "id": "node-000/gpu0"})
    (tmp_path / "truth.jsonl").write_bytes(orjson.dumps(wrong) + b"\n")
    diagnoses_of(RingJob(stuck_rank={11: 40}), tmp_path / "d.jsonl")
    result = run_c4("score", "--truth", str(tmp_path / "truth.jsonl"), str(tmp_path / "d.jsonl"))
    assert result.returncode == 1
    assert "MISSED" in result.stdout and "false finding: noncomm_hang" in result.stdout


def test_bad_truth_file_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "truth.jsonl").write_text('{"fault": 1}\n')
    (tmp_path / "d.jsonl").write_text("")
    result = run_c4("score", "--truth", str(tmp_path / "truth.jsonl"), str(tmp_path / "d.jsonl"))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "not a ground-truth line" in result.stderr
