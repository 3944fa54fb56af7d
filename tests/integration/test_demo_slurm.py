"""``c4 demo --slurm`` end to end: a real Slurm cluster of its own, the shared Kafka and Redis,
the real training job, real faults; everything it started gone at the end.

The demo runs as a subprocess with a stack folder and a Slurm port of its own (18817: the
``slurm_stack`` fixture's cluster is on 17817, `c4 stack up --slurm`'s on 16817), so it
starts and stops its own Slurm cluster, while Kafka and Redis are the shared ones it finds
answering (and leaves running). The stack folder is a short one under /tmp: slurmstepd's
Unix sockets live in it, and a socket path holds 108 bytes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from confluent_kafka.admin import AdminClient

from c4.settings import Settings
from c4.stack.slurm import slurm_status

pytestmark = pytest.mark.integration

SLURM_PORT = 18817


def _cmdlines_naming(folder: Path) -> list[str]:
    """Command lines of live processes that name ``folder`` (the demo's leftovers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(folder) in line and state != "Z":
            found.append(f"{proc.name}: {line}")
    return found


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    """A short stack folder of the test's own (removed after)."""
    folder = Path(tempfile.mkdtemp(prefix="c4-ds-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(900)
def test_the_slurm_demo_finds_every_fault_acts_and_the_job_completes(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path, stack_dir: Path
) -> None:
    report = tmp_path / "report"
    stack = stack_dir
    env = dict(
        os.environ,
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        C4_REDIS_URL=redis_url,
        C4_TOPIC_PREFIX=f"test.{unique}.",
        C4_REDIS_KEY_PREFIX=f"test:{unique}",
        C4_STACK_DIR=str(stack),
        C4_STACK_SLURM_PORT=str(SLURM_PORT),
    )
    command = [sys.executable, "-m", "c4.cli", "demo", "--slurm", "--hangs", "1"]
    done = subprocess.run(
        [*command, "--report", str(report)],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    out = done.stdout
    assert done.returncode == 0, out[-6000:] + done.stderr[-3000:]
    # Kafka and Redis were the shared ones; Slurm its own, started and stopped again.
    assert f"stack: using Kafka {kafka_bootstrap}" in out
    assert "slurm: 4 nodes, started" in out
    assert "slurm: stopping the local Slurm cluster this run started" in out
    # The table: the hang found on the stopped node, drained with c4's reason, the job
    # requeued once and running again; the straggler named, drained, requeued again.
    hang = re.search(
        r"^\s*[\d.]+\s+hang: SIGSTOP every rank\s+(node-\d{3})\s+(node_down|noncomm_hang)\s+"
        r"(\1\S*)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+(c4:d-\w+ \2 \1\S*)\s+1\s+RUNNING$",
        out,
        re.M,
    )
    assert hang is not None, out
    straggler = re.search(
        r"^\s*[\d.]+\s+straggler: SIGSTOP 30 ms of 100\s+(node-\d{3})\s+noncomm_slow\s+(\1\S*)\s+"
        r"([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(c4:d-\w+ noncomm_slow \1\S*)\s+2\s+RUNNING$",
        out,
        re.M,
    )
    assert straggler is not None, out
    assert re.search(r"^hang to drain: p50 [\d.]+ s, worst [\d.]+ s over 1 of 1 hangs", out, re.M)
    assert re.search(r"^job \d+: COMPLETED, exit code 0:0, 2 restarts", out, re.M), out
    assert re.search(r"^PASS: 2/2 faults found, 2/2 acted on", out, re.M), out
    # The same as JSON.
    document = orjson.loads((report / "slurm-demo.json").read_bytes())
    assert document["passed"] and document["job"]["state"] == "COMPLETED"
    first, second = document["faults"]
    assert (first["kind"], first["culprit"], first["restarts"]) == ("hang", hang[1], 1)
    assert first["reason"] == hang[6] and first["to_drain_s"] == pytest.approx(
        float(hang[5]), abs=0.06
    )
    assert first["sinfo_line"].endswith(hang[1])  # sinfo -R's own line names the node
    assert (second["kind"], second["culprit"], second["restarts"]) == ("straggler", straggler[1], 2)
    assert document["figures"]["hang_to_drain"]["count"] == 1
    # Nothing it started is left: its processes, its Slurm cluster, its topics and keys.
    for folder in (tmp_path, stack):
        assert not _cmdlines_naming(folder), _cmdlines_naming(folder)
    private = Settings(stack_dir=stack, stack_slurm_port=SLURM_PORT)
    assert {status.state for status in slurm_status(private)} == {"stopped"}
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=15).topics
    assert not [name for name in topics if name.startswith(f"test.{unique}.")]
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.ping()  # the shared Redis still runs
        assert not list(client.scan_iter(match=f"test:{unique}:*", count=1000))
    finally:
        client.close()
