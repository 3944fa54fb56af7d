"""Progress bars of ``c4 diagnose`` and ``c4 simulate``: on stderr while it is a terminal
(here a pseudo-terminal, as a person's would be), nothing more when it is piped.

The commands run as a person runs them, in a process of their own; what they write to the
terminal is read from the pseudo-terminal's other end.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import orjson

from schemas.codec import encode
from tests.unit.ring_job import RingJob

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = {
    "seed": 3,
    "duration_s": 20,
    "faults": [{"type": "slow_gpu", "job": "job-1", "rank": 13, "factor": 2.0, "at_s": 8}],
    "jobs": [{"id": "job-1", "ranks": 32, "compute_ms": 150}],
}


def c4(*args: str) -> list[str]:
    return [sys.executable, "-m", "c4.cli", *args]


def piped(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The command with stdout and stderr to pipes."""
    return subprocess.run(
        c4(*args), stdin=subprocess.DEVNULL, capture_output=True, cwd=ROOT, timeout=120
    )


def on_terminal(*args: str, stdout: Path | None = None) -> tuple[int, str]:
    """The command with stderr (and stdout, unless ``stdout``) on a 100-column terminal;
    its exit status and everything the terminal received."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with open(stdout, "wb") if stdout else open(os.devnull, "wb") as out:
        process = subprocess.Popen(
            c4(*args),
            stdin=subprocess.DEVNULL,
            stdout=out if stdout else side,
            stderr=side,
            cwd=ROOT,
            env={**os.environ, "TERM": "xterm"},
        )
        os.close(side)
        received = bytearray()
        while True:
            try:
                chunk = os.read(main, 1 << 16)
            except OSError:  # EIO: the command's end of the terminal closed
                break
            if not chunk:
                break
            received += chunk
        os.close(main)
        status = process.wait(timeout=120)
    return status, received.decode("utf-8", errors="replace")


def shown_lines(received: str) -> list[str]:
    """The terminal's lines as they stand at the end: each line's text after its last
    carriage return (a bar redrawn in place leaves only its last state)."""
    lines = received.replace("\r\n", "\n").split("\n")
    return [line.rsplit("\r", 1)[-1].rstrip() for line in lines]


def replay_input(tmp_path: Path) -> Path:
    job = RingJob(stuck_rank={11: 40})
    lines = [encode(job.job_message()), *(encode(m) for m in job.messages())]
    lines.insert(9, b"not json")
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_diagnose_piped_writes_only_its_lines(tmp_path: Path) -> None:
    done = piped("diagnose", str(replay_input(tmp_path)))
    assert done.returncode == 0
    errors = done.stderr.decode().splitlines()
    assert len(errors) == 2 and errors[0].startswith("line 10: invalid JSON")
    assert errors[1].endswith(" messages, 1 rejected")
    assert b"\r" not in done.stderr and b"%|" not in done.stderr


def test_diagnose_on_a_terminal_shows_a_bar_and_the_same_output(tmp_path: Path) -> None:
    source = replay_input(tmp_path)
    expected = piped("diagnose", str(source))
    status, received = on_terminal("diagnose", str(source), stdout=tmp_path / "out.jsonl")
    assert status == 0
    assert "diagnose:" in received and "%|" in received and "B/s]" in received
    assert (tmp_path / "out.jsonl").read_bytes() == expected.stdout
    lines = [line for line in shown_lines(received) if line.strip()]
    # The rejected line printed above the bar, the bar gone at the end: the last line alone.
    assert any(line.startswith("line 10: invalid JSON") for line in lines)
    assert lines[-1] == expected.stderr.decode().splitlines()[-1]


def test_diagnose_diagnoses_on_the_same_terminal_stand_on_lines_of_their_own(
    tmp_path: Path,
) -> None:
    source = replay_input(tmp_path)
    expected = piped("diagnose", str(source)).stdout.decode().splitlines()
    status, received = on_terminal("diagnose", str(source))
    assert status == 0 and expected
    assert "%|" in received
    shown = [line for line in shown_lines(received) if '"kind":"diagnosis"' in line]
    assert shown == expected  # each whole, at the start of its line: the bar stepped aside


def test_simulate_piped_writes_only_its_line(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_bytes(orjson.dumps(SCENARIO))
    done = piped("simulate", "--scenario", str(scenario), "--out", str(tmp_path / "run.jsonl"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(b"\n") == 1
    assert b" messages (" in done.stderr and b"\r" not in done.stderr


def test_simulate_on_a_terminal_shows_event_time_and_writes_the_same_run(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_bytes(orjson.dumps(SCENARIO))
    piped_run, shown_run = tmp_path / "piped.jsonl", tmp_path / "shown.jsonl"
    expected = piped("simulate", "--scenario", str(scenario), "--out", str(piped_run))
    status, received = on_terminal("simulate", "--scenario", str(scenario), "--out", str(shown_run))
    assert status == 0
    assert "simulate:" in received and "s of event time" in received
    assert shown_run.read_bytes() == piped_run.read_bytes()
    lines = [line for line in shown_lines(received) if line.strip()]
    assert lines[-1] == expected.stderr.decode().strip().replace(str(piped_run), str(shown_run))


def test_simulate_to_the_terminal_itself_shows_no_bar(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_bytes(orjson.dumps(SCENARIO))
    status, received = on_terminal("simulate", "--scenario", str(scenario))
    assert status == 0
    assert '"kind":"collective"' in received  # the run's lines are the progress there
    assert "s of event time" not in received
