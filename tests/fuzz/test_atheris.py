"""Run the coverage-guided fuzzers (atheris, libFuzzer) for a bounded time, as CI does.

Each harness starts from a seed corpus of valid inputs (the contract's examples; pickled
Flight Recorder dumps) and mutates them for ``SECONDS`` seconds. It passes when libFuzzer
finishes without a crash; a crash fails the test with the harness's report and the crashing
input (a ``crash-*`` file) named. Longer runs: call the harness directly, e.g.
``python tests/fuzz/fuzz_codec.py -max_total_time=600 corpus/``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.contract import contract_examples

HERE = Path(__file__).parent
SECONDS = 10
T0 = 1_800_000_000_000_000_000


def codec_seeds(corpus: Path) -> None:
    for kind, example in contract_examples().items():
        (corpus / kind).write_bytes(orjson.dumps(example))


def flight_recorder_seeds(corpus: Path) -> None:
    def entry(seq: int, name: str, completed: int | None) -> dict[str, object]:
        return {
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": seq,
            "profiling_name": name,
            "time_created_ns": T0 + seq * 1_000_000,
            "time_discovered_completed_ns": completed,
            "state": "completed" if completed else "started",
            "input_sizes": [[1024, 4]],
            "input_dtypes": ["Float"],
            "is_p2p": " " in name,
        }

    hang = {
        "version": "2.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
        "pg_status": {"0": {"last_completed_collective": 2}},
        "entries": [
            entry(1, "nccl:all_reduce", T0 + 1_500_000),
            entry(2, "nccl:_all_gather_base", T0 + 2_500_000),
            entry(3, "nccl:send 0->1", T0 + 3_400_000),
            entry(4, "nccl:all_reduce", None),
        ],
    }
    (corpus / "hang").write_bytes(pickle.dumps(hang))
    (corpus / "empty").write_bytes(pickle.dumps({"entries": []}, protocol=2))


@pytest.mark.parametrize(
    ("harness", "seed"),
    [("fuzz_codec.py", codec_seeds), ("fuzz_flight_recorder.py", flight_recorder_seeds)],
    ids=["codec", "flight-recorder"],
)
def test_fuzzer_finds_no_crash(tmp_path: Path, harness: str, seed: Callable[[Path], None]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seed(corpus)
    result = subprocess.run(
        [
            sys.executable,
            str(HERE / harness),
            f"-max_total_time={SECONDS}",
            "-timeout=10",
            "-rss_limit_mb=2048",
            "-max_len=65536",
            "-print_final_stats=1",
            str(corpus),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        check=False,
    )
    report = (result.stdout + result.stderr)[-6000:]
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "oom-")))
    assert result.returncode == 0 and not crashes, f"{harness}: {crashes}\n{report}"
    # libFuzzer really ran: it reports how many inputs it executed.
    runs = [line for line in report.splitlines() if "stat::number_of_executed_units" in line]
    assert runs and int(runs[-1].split(":")[-1]) > 100, report
