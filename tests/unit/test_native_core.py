"""The compiled detection core: used only as the build of these sources, same findings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import streams.core
from streams.core import comm, native

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "examples"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def core_in(env: dict[str, str]) -> str:
    """Which core a fresh interpreter with ``env`` runs."""
    found = run("-c", "import streams.core as c; print(c.NATIVE)", env=env)
    assert found.returncode == 0, found.stderr
    return found.stdout.decode().strip()


def requires_build() -> None:
    if native.build_status() != "compiled":
        why = native.build_status()
        pytest.skip(f"compiled core not built here ({why}); the test command builds it")


def test_this_process_runs_what_status_says() -> None:
    assert streams.core.NATIVE == native.status()
    assert comm.__file__ is not None
    assert comm.__file__.endswith(".py") == (streams.core.NATIVE != "compiled")


def test_compiled_by_default_and_pure_when_forced() -> None:
    requires_build()
    assert core_in({"C4_PURE_PYTHON": ""}) == "compiled"
    assert core_in({"C4_PURE_PYTHON": "0"}) == "compiled"
    assert core_in({"C4_PURE_PYTHON": "1"}) == "pure (C4_PURE_PYTHON is set)"


def test_no_build_or_a_build_of_other_sources_runs_the_pure_core(tmp_path: Path) -> None:
    empty = tmp_path / "none"
    assert core_in({"C4_NATIVE_DIR": str(empty)}).startswith("pure (not built")
    stale = tmp_path / "stale"
    stale.mkdir()
    built = native.fingerprint()
    sources = built["sources"]
    assert isinstance(sources, dict)
    edited = {**built, "sources": {**sources, "comm.py": "0" * 64}}  # comm.py edited since
    (stale / native.MANIFEST).write_text(json.dumps({"fingerprint": edited}))
    assert core_in({"C4_NATIVE_DIR": str(stale)}).startswith("pure (the build is")
    (stale / native.MANIFEST).write_text("{not json")
    assert core_in({"C4_NATIVE_DIR": str(stale)}).startswith("pure (not built")


@pytest.mark.parametrize("scenario", ["scenario-demo.json", "scenario-chaos.json"])
def test_compiled_and_pure_cores_give_the_same_findings(tmp_path: Path, scenario: str) -> None:
    requires_build()
    recorded = tmp_path / "run.jsonl"
    simulated = run(
        "-m", "c4.cli", "simulate", "--scenario", str(SCENARIOS / scenario), "--out", str(recorded)
    )
    assert simulated.returncode == 0, simulated.stderr
    compiled = run("-m", "c4.cli", "diagnose", str(recorded))
    pure = run("-m", "c4.cli", "diagnose", str(recorded), env={"C4_PURE_PYTHON": "1"})
    assert compiled.returncode == pure.returncode == 0, (compiled.stderr, pure.stderr)
    assert compiled.stdout.count(b"\n") >= 3  # findings to agree on, not an empty run
    assert compiled.stdout == pure.stdout
