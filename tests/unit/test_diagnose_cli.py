from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from schemas.codec import Rejection, decode, encode
from schemas.messages import Diagnosis
from tests.unit.ring_job import RingJob


def run_c4(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args], input=stdin, capture_output=True, timeout=120
    )


def test_replay_prints_diagnoses_and_reports_bad_lines(tmp_path: Path) -> None:
    job = RingJob(stuck_rank={11: 40})
    lines = [encode(job.job_message())] + [encode(m) for m in job.messages()]
    lines.insert(5, b'{"v": 1, "kind": "collective", "rank": -1}')
    lines.insert(9, b"not json")
    result = run_c4("diagnose", "-", stdin=b"\n".join(lines) + b"\n")
    assert result.returncode == 0, result.stderr
    errors = result.stderr.decode().splitlines()
    assert errors[0].startswith("line 6: ")
    assert errors[1].startswith("line 10: invalid JSON")
    found = [decode(line) for line in result.stdout.splitlines()]
    assert all(isinstance(d, Diagnosis) for d in found)
    assert not any(isinstance(d, Rejection) for d in found)
    hang = [d for d in found if isinstance(d, Diagnosis) and d.class_ == "noncomm_hang"]
    assert hang and hang[0].suspects[0].id == "node-001/gpu3"


def test_placement_from_jobs_file(tmp_path: Path) -> None:
    job = RingJob(stuck_rank={11: 40})
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(encode(job.job_message()) + b"\n")
    stripped = [m.model_copy(update={"node": None, "gpu": None}) for m in job.messages()]
    stdin = b"\n".join(encode(m) for m in stripped) + b"\n"
    with_jobs = run_c4("diagnose", "--jobs", str(jobs), stdin=stdin)
    without = run_c4("diagnose", stdin=stdin)
    named = [decode(line) for line in with_jobs.stdout.splitlines()]
    bare = [decode(line) for line in without.stdout.splitlines()]
    assert isinstance(named[0], Diagnosis) and named[0].suspects[0].id == "node-001/gpu3"
    assert isinstance(bare[0], Diagnosis) and bare[0].suspects[0].id == "job-1/rank11"


def test_bad_files_give_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "topo.json"
    bad.write_text('{"v": 1, "kind": "topology", "nodes": 3}')
    result = run_c4("diagnose", "--topology", str(bad))
    assert result.returncode == 1
    assert b"topo.json: nodes: should be a valid tuple, got integer 3" in result.stderr
    assert result.stderr.count(b"\n") == 1
    params = tmp_path / "params.json"
    params.write_text('{"defaults": {"no_such": 1}}')
    result = run_c4("diagnose", "--params", str(params))
    assert result.returncode == 1
    assert b"unknown detector parameter 'no_such'" in result.stderr
    params.write_text('{"defaults": {"slow_recent_ops": 0}}')  # no median of nothing
    result = run_c4("diagnose", "--params", str(params))
    assert result.returncode == 1
    assert b"slow_recent_ops is a window size: at least 1, got 0" in result.stderr
