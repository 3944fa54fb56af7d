"""Every command of the README's command table that reads a file, against hostile files.

Deep JSON, a line far over any message's size, ``/dev/zero``, binary data and NaN: each
gives a non-zero exit, one error line naming the file (no traceback), inside a hard memory
limit on the process (an unbounded read would fail it) and a wall-clock guard (an endless
read would): the guard stops a hung command, it measures nothing.

Commands that talk to Kafka or Redis get addresses where nothing listens: a bad file must be
refused before they connect to anything.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.contract import contract_examples

MEMORY_LIMIT_BYTES = 640 * 1024 * 1024
HUGE_LINE_BYTES = 256 * 1024 * 1024  # read whole, twice over the memory limit with a copy
HANG_GUARD_S = 120
NOWHERE = {"C4_KAFKA_BOOTSTRAP": "127.0.0.1:1", "C4_REDIS_URL": "redis://127.0.0.1:1/0"}

# (argv with {hostile} where the hostile file goes), from the README's command table.
COMMANDS = [
    ["validate", "{hostile}"],
    ["validate", "--kind", "topology", "{hostile}"],
    ["diagnose", "{hostile}"],
    ["diagnose", "--topology", "{hostile}", "messages.jsonl"],
    ["diagnose", "--jobs", "{hostile}", "messages.jsonl"],
    ["diagnose", "--params", "{hostile}", "messages.jsonl"],
    ["score", "--truth", "{hostile}", "messages.jsonl"],
    ["topology", "slurm-conf", "--topology", "{hostile}"],
    ["topology", "import", "--ibnetdiscover", "{hostile}"],
    ["topology", "import", "--slurm-conf", "{hostile}"],
    ["topology", "import", "--lldp", "{folder}"],
    ["topology", "import", "--slurm-conf", "topology.json", "--map", "{hostile}"],
    ["topology", "diff", "{hostile}", "topology.json"],
    ["plan", "--topology", "{hostile}", "--flows", "flows.json"],
    ["plan", "--topology", "topology.json", "--flows", "{hostile}"],
    ["simulate", "--scenario", "{hostile}"],
    ["state", "load", "--topology", "{hostile}"],
    ["streams", "worker", "--topology", "{hostile}"],
    ["streams", "worker", "--params", "{hostile}"],
    ["actions", "worker", "--config", "{hostile}"],
    ["demo", "--scenario", "{hostile}", "--no-dashboard"],
    # A folder holding only the hostile file (/dev/zero linked in: a device never ends).
    ["convert", "nccl-inspector", "{folder}", "--job", "j"],
    ["convert", "flight-recorder", "{folder}", "--job", "j"],
]
KINDS = ["deep", "huge-line", "dev-zero", "binary", "nan"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Good companion files and one file of each hostile kind."""
    here = tmp_path_factory.mktemp("hostile")
    examples = contract_examples()
    (here / "topology.json").write_bytes(orjson.dumps(examples["topology"]))
    (here / "flows.json").write_bytes(orjson.dumps(examples["flows"]))
    lines = [orjson.dumps(examples[kind]) for kind in ("job", "collective")]
    (here / "messages.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (here / "deep").write_bytes(b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"\n")
    with (here / "huge-line").open("wb") as out:
        out.write(b'{"v": 1, "kind": "topology", "pad": "')
        block = b"x" * (1 << 20)
        for _ in range(HUGE_LINE_BYTES >> 20):
            out.write(block)
        out.write(b'"}\n')
    (here / "binary").write_bytes(bytes(range(256)) * 64)
    (here / "nan").write_bytes(b'{"v": 1, "kind": "topology", "nodes": [NaN], "x": Infinity}\n')
    yield here
    (here / "huge-line").unlink()


def limited() -> None:
    """In the child: a hard limit on its address space."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda argv: " ".join(argv))
def test_a_hostile_file_gives_a_non_zero_exit_and_one_error_line(
    workdir: Path, command: list[str], kind: str
) -> None:
    hostile = "/dev/zero" if kind == "dev-zero" else str(workdir / kind)
    folder = workdir / f"folder-{kind}"
    if not folder.exists():
        folder.mkdir()
        if kind == "dev-zero":
            (folder / "dump0").symlink_to(hostile)
        else:
            shutil.copyfile(hostile, folder / "dump0")  # a dump's name: ends with its rank
    argv = [part.replace("{hostile}", hostile).replace("{folder}", str(folder)) for part in command]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), **NOWHERE}
    result = subprocess.run(  # noqa: S603 - our own CLI, argv from the table above
        [sys.executable, "-m", "c4.cli", *argv],
        cwd=workdir,
        env=env,
        capture_output=True,
        timeout=HANG_GUARD_S,
        preexec_fn=limited,  # noqa: PLW1509 - only setrlimit, before exec
        check=False,
    )
    err = result.stderr.decode(errors="replace")
    assert result.returncode != 0, (argv, err)
    assert "Traceback" not in err, err
    assert "MemoryError" not in err and "RecursionError" not in err, err
    lines = err.strip().splitlines()
    assert lines, argv
    last = lines[-1]
    if command[0] == "validate" and kind not in ("dev-zero", "binary"):
        # validate reports each rejected line on stdout and its count on stderr.
        assert last.endswith("rejected") and "0 valid" in last, err
        assert result.stdout.decode().startswith("line 1: "), result.stdout
    else:
        assert last.startswith(("c4: error: ", f"c4 {command[0]}: error: ")), err
        name = "/dev/zero" if kind == "dev-zero" else kind
        if command[0] == "convert" or "--lldp" in command:
            name = f"folder-{kind}"  # the folder, its file named on the lines before
        assert name in last, err
