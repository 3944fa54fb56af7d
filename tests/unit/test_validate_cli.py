from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from schemas.records import BATCHES
from tests.contract import contract_examples
from tests.invalid_cases import invalid_cases


def run_c4(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args], input=stdin, capture_output=True, timeout=60
    )


def test_all_valid_exits_zero(tmp_path: Path) -> None:
    lines = b"\n".join(orjson.dumps(example) for example in contract_examples().values())
    path = tmp_path / "ok.jsonl"
    path.write_bytes(lines + b"\n\n")
    result = run_c4("validate", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == b""
    # One example per kind, a batch (collectives, links, gpus) counting as its messages.
    examples = contract_examples()
    count = sum(len(e["messages"]) if kind in BATCHES else 1 for kind, e in examples.items())
    assert f"{count} valid, 0 rejected".encode() in result.stderr


def test_rejected_lines_are_numbered_and_exit_one() -> None:
    good = orjson.dumps(contract_examples()["collective"])
    bad = [case for case in invalid_cases() if b"\n" not in case.data and case.data][:5]
    stdin = b"\n".join([good, *(case.data for case in bad), good]) + b"\n"
    result = run_c4("validate", "-", stdin=stdin)
    assert result.returncode == 1
    out = result.stdout.decode().splitlines()
    assert len(out) == len(bad)
    for number, (line, case) in enumerate(zip(out, bad, strict=True), start=2):
        assert line.startswith(f"line {number}: ")
        assert case.reason in line


def test_kind_option_rejects_other_kinds() -> None:
    stdin = orjson.dumps(contract_examples()["link"]) + b"\n"
    result = run_c4("validate", "--kind", "collective", stdin=stdin)
    assert result.returncode == 1
    assert result.stdout == b"line 1: kind: expected 'collective', got 'link'\n"


def test_usage_errors_exit_two(tmp_path: Path) -> None:
    assert run_c4("validate", "--kind", "nonsense").returncode == 2
    missing = run_c4("validate", str(tmp_path / "absent.jsonl"))
    assert missing.returncode == 2
    assert missing.stderr.count(b"\n") == 1
    assert b"No such file" in missing.stderr


def test_a_batch_is_checked_message_by_message() -> None:
    single = contract_examples()["collective"]
    batch = dict(contract_examples()["collectives"])
    batch["messages"] = [single, {**single, "rank": 20}, {**single, "job": "job-7"}, single]
    stdin = orjson.dumps(batch) + b"\n"
    result = run_c4("validate", "--kind", "collective", stdin=stdin)
    assert result.returncode == 1
    assert result.stdout.decode().splitlines() == [
        "line 1: messages[1].rank: 20 >= comm_size 16",
        "line 1: messages[2].job: 'job-7' is not the batch's job 'job-42'",
    ]
    assert b"2 valid, 2 rejected" in result.stderr


def test_a_broken_batch_envelope_rejects_the_line() -> None:
    batch = {**contract_examples()["collectives"], "messages": {"not": "an array"}}
    stdin = orjson.dumps(batch) + b"\n"
    result = run_c4("validate", "--kind", "collectives", stdin=stdin)
    assert result.returncode == 1
    assert result.stdout == b"line 1: messages: should be a valid tuple, got object\n"
    assert b"0 valid, 1 rejected" in result.stderr
