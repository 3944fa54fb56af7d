"""``c4 diagnose --workers N``: the node stages in worker processes find what one detector
finds, bad lines and placements included (`streams.spread_replay`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from schemas.codec import encode
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from streams.spread_replay import route
from tests.unit.ring_job import RingJob
from tests.unit.suite_cases import suite_case

ROOT = Path(__file__).resolve().parents[2]


def run_c4(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(  # noqa: S603 -- this interpreter, our own command
        [sys.executable, "-m", "c4.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )


def test_a_line_is_routed_by_its_text_without_decoding() -> None:
    single = b'{"v":1,"kind":"collective","job":"j","node":"n-3","ts_ns":17,"ops":{}}'
    assert route(single) == ("n-3", 17)
    batch = (
        b'{"v": 1, "kind": "collectives", "job": "j", "node": "n-4", "ts_ns": 30,'
        b' "messages": [{"kind": "collective", "node": "n-4", "ts_ns": 41}]}'
    )
    assert route(batch) == ("n-4", 41)  # the latest time in it, the batch's own among them
    assert route(b'{"v":1,"kind":"collective","job":"j-9","ts_ns":5}') == ("j-9", 5)
    assert route(b'{"v":1,"kind":"link","node":"n-1","ts_ns":5}') is None
    assert route(b"not json") is None


@pytest.mark.parametrize("kind", ["slow_gpu", "node_down", "link_down", "process_stuck"])
def test_workers_find_what_one_detector_finds(tmp_path: Path, kind: str) -> None:
    scenario = suite_case(kind)
    cluster = build_cluster(None, scenario)
    recorded = tmp_path / "case.jsonl"
    recorded.write_bytes(b"".join(encode(m) + b"\n" for m in simulate_cluster(cluster, scenario)))
    alone = run_c4("diagnose", str(recorded))
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout  # a fault found: a comparison of nothing proves nothing
    for workers in ("1", "3"):
        spread = run_c4("diagnose", "--workers", workers, str(recorded))
        assert spread.returncode == 0, spread.stderr
        assert spread.stdout == alone.stdout, workers
        assert spread.stderr.splitlines()[-1] == alone.stderr.splitlines()[-1]  # the counts


def test_bad_lines_are_reported_with_their_numbers_and_the_good_ones_taken() -> None:
    job = RingJob(stuck_rank={11: 40})
    lines = [encode(job.job_message())] + [encode(m) for m in job.messages()]
    lines.insert(5, b'{"v": 1, "kind": "collective", "job": "job-1", "node": "x", "rank": -1}')
    lines.insert(9, b"not json")
    lines.insert(12, b'{"v": 1, "kind": "collective", "node": "node-001", "ts_ns": "soon"')
    stdin = b"\n".join(lines) + b"\n"
    alone = run_c4("diagnose", "-", stdin=stdin)
    spread = run_c4("diagnose", "--workers", "2", "-", stdin=stdin)
    assert spread.returncode == 0, spread.stderr
    assert spread.stdout == alone.stdout
    assert b"noncomm_hang" in spread.stdout
    errors = sorted(spread.stderr.decode().splitlines()[:-1])
    assert sorted(alone.stderr.decode().splitlines()[:-1]) == errors
    assert [e.split(":")[0] for e in errors] == ["line 10", "line 13", "line 6"]
    assert spread.stderr.splitlines()[-1] == alone.stderr.splitlines()[-1]


def test_placements_reach_the_job_stage_before_the_reports(tmp_path: Path) -> None:
    job = RingJob(stuck_rank={11: 40})
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(encode(job.job_message()) + b"\n")
    stripped = [m.model_copy(update={"node": None, "gpu": None}) for m in job.messages()]
    stdin = b"\n".join(encode(m) for m in stripped) + b"\n"
    spread = run_c4("diagnose", "--workers", "2", "--jobs", str(jobs), "-", stdin=stdin)
    assert spread.returncode == 0, spread.stderr
    assert b"node-001/gpu3" in spread.stdout


def test_workers_must_be_a_positive_number() -> None:
    refused = run_c4("diagnose", "--workers", "none", "-")
    assert refused.returncode == 2
    assert b"not a whole number" in refused.stderr
