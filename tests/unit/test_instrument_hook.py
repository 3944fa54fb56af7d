"""The C4_INSTRUMENT switch (c4-instrument.pth), its failures, `c4 run`, and the member record
on its way from the handoff folder to the job topic.

The processes started here run this virtualenv's Python from a folder outside the
repository, so what they import comes through the installed package (the editable install
here), ``c4-instrument.pth`` included: without it, ``pip install -e .`` was not run since
the hook was added.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import site
import socket
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import c4_autoinstrument
from producers.agent import Agent
from producers.handoff import FolderSink, HandoffSource
from schemas.messages import Collective, Member, Ops
from schemas.topics import TOPICS_BY_KIND

ROOT = Path(__file__).resolve().parents[2]
# Variables of the launchers and of c4 that the parent may have: the children start clean.
LAUNCH_VARIABLES = ("C4_", "SLURM", "TORCHELASTIC_", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher or c4 variables, plus ``extra``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(LAUNCH_VARIABLES) and name not in ("PYTHONPATH", "MASTER_PORT")
    }
    return {**env, "PYTHONWARNINGS": "ignore", **extra}


def python(
    code: str, cwd: Path, timeout: float = 300, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=clean_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def c4_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("c4")]


def load_backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location("c4_build", ROOT / "build_backend/c4_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The .pth file -------------------------------------------------------------------------


def test_the_pth_file_is_installed_for_this_python() -> None:
    folders = [Path(folder) for folder in site.getsitepackages()]
    found = [folder / "c4-instrument.pth" for folder in folders]
    found = [path for path in found if path.is_file()]
    assert found, f"no c4-instrument.pth in {folders}: run pip install -e . again"
    assert found[0].read_text().strip() == c4_autoinstrument.PTH_LINE


def test_the_backend_writes_the_line_of_the_module_into_a_wheel_with_its_record(
    tmp_path: Path,
) -> None:
    backend = load_backend()
    assert backend.PTH_LINE == c4_autoinstrument.PTH_LINE
    assert backend.PTH_NAME == c4_autoinstrument.PTH_NAME
    wheel = tmp_path / "x-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("x/__init__.py", "")
        archive.writestr("x-1.dist-info/METADATA", "Name: x\n")
        archive.writestr("x-1.dist-info/RECORD", "x/__init__.py,,0\nx-1.dist-info/RECORD,,\n")
    for _ in range(2):  # adding it again replaces it
        backend.add_pth(wheel)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        data = archive.read("c4-instrument.pth")
        record = archive.read("x-1.dist-info/RECORD").decode().splitlines()
    assert names.count("c4-instrument.pth") == 1
    assert names[-1] == "x-1.dist-info/RECORD"
    assert data.decode() == c4_autoinstrument.PTH_LINE + "\n"
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert [row for row in record if row.startswith("c4-instrument.pth,")] == [
        f"c4-instrument.pth,sha256={digest},{len(data)}"
    ]
    assert record[-1] == "x-1.dist-info/RECORD,,"


def test_the_image_copies_what_the_build_needs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    copied = {
        word.rstrip("/")
        for line in dockerfile.splitlines()
        if line.startswith("COPY ")
        for word in line.split()[1:-1]
    }
    needed = {"pyproject.toml", "MANIFEST.in", *pyproject["build-system"]["backend-path"]}
    needed |= {f"{module}.py" for module in pyproject["tool"]["setuptools"]["py-modules"]}
    assert needed <= copied


SHOW_MODULES = """
import json, sys
print(json.dumps({
    "modules": sorted(name for name in sys.modules
                      if name.split(".")[0] in ("torch", "c4", "c4_autoinstrument", "producers",
                                                "schemas", "numpy")),
    "finders": [type(finder).__name__ for finder in sys.meta_path],
}))
"""


@pytest.mark.parametrize("switch", [None, "0", "off", ""])
def test_without_the_switch_the_hook_imports_nothing(tmp_path: Path, switch: str | None) -> None:
    extra = {} if switch is None else {"C4_INSTRUMENT": switch}
    result = python(SHOW_MODULES, tmp_path, **extra)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    # Unset: not even c4_autoinstrument; set to an "off" value: that module and nothing more.
    assert shown["modules"] == ([] if switch is None else ["c4_autoinstrument"])
    assert "_PostImportFinder" not in shown["finders"]
    assert result.stderr == ""


def test_with_the_switch_the_hook_waits_for_torch_without_importing_it(tmp_path: Path) -> None:
    result = python(SHOW_MODULES, tmp_path, C4_INSTRUMENT="1")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert not [name for name in shown["modules"] if name.startswith(("torch", "numpy"))]
    assert not [name for name in shown["modules"] if name.startswith(("schemas", "c4."))]
    assert "_PostImportFinder" in shown["finders"]
    assert result.stderr == ""


def test_every_binding_of_init_process_group_is_the_wrapper(tmp_path: Path) -> None:
    code = """
import inspect, json, sys
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed import device_mesh
from torch.distributed import init_process_group
print(json.dumps({
    "wrapped": getattr(dist.init_process_group, "__c4_wrapped__", False),
    "same": [c10d.init_process_group is f for f in (dist.init_process_group, init_process_group,
             device_mesh.__dict__.get("init_process_group", dist.init_process_group))],
    "destroy": dist.destroy_process_group is c10d.destroy_process_group
               and dist.destroy_process_group.__wrapped__ is not None,
    "signature": list(inspect.signature(dist.init_process_group).parameters)[:2],
    "loader": type(c10d.__loader__).__name__,
    "finders": [type(finder).__name__ for finder in sys.meta_path],
}))
"""
    result = python(code, tmp_path, C4_INSTRUMENT="1")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["wrapped"] is True and shown["same"] == [True, True, True]
    assert shown["destroy"] is True
    assert shown["signature"] == ["backend", "init_method"]
    assert shown["loader"] == "SourceFileLoader"  # the module keeps its own loader
    assert "_PostImportFinder" not in shown["finders"]  # the hook left once done


# Failures: one line, the training untouched -------------------------------------------

ONE_RANK = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
tensor = torch.ones(8)
dist.all_reduce(tensor)
dist.destroy_process_group()
print("trained", tensor.sum().item())
"""


def one_rank(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ONE_RANK, f"tcp://127.0.0.1:{free_port()}"],
        cwd=tmp_path,
        env=clean_env(C4_INSTRUMENT="1", **extra),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"C4_HANDOFF_DIR": "{blocked}/handoff"}, "cannot write to the handoff folder "),
        ({"C4_RANK": "abc"}, "C4_RANK='abc' is not a non-negative integer"),
        ({"C4_INTERVAL_S": "often"}, "C4_INTERVAL_S='often' is not a number of seconds"),
        ({"C4_JOB": ""}, "no job id: set C4_JOB"),
        ({"C4_WORLD_SIZE": "1", "C4_RANK": "3"}, "no valid member message: rank:"),
    ],
)
def test_a_failure_is_one_line_and_the_training_runs_on(
    tmp_path: Path, settings: dict[str, str], reason: str
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")  # no folder can be made under it, even by root
    env = {"C4_JOB": "j1", "C4_HANDOFF_DIR": str(tmp_path / "out")}
    env |= {name: value.format(blocked=blocked) for name, value in settings.items()}
    result = one_rank(tmp_path, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "trained 8.0"
    lines = c4_lines(result.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("c4: instrumentation off: " + reason), lines
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_rank_instrumented_in_one_process_reports_and_records(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = one_rank(tmp_path, C4_JOB="j1", C4_HANDOFF_DIR=str(out), C4_NODE="node-9")
    assert result.returncode == 0, result.stderr
    assert c4_lines(result.stderr) == []
    reading = HandoffSource(out).read(0)
    assert reading.problems == []
    members = [m for m in reading.messages if isinstance(m, Member)]
    assert [(m.job, m.rank, m.world_size, m.node, m.gpu) for m in members] == [
        ("j1", 0, 1, "node-9", None)
    ]
    ops = [op for m in reading.messages if isinstance(m, Collective) for op in m.ops.op]
    assert ops == ["allreduce"]  # sent when the default group was destroyed
    assert [p.name for p in out.iterdir()] == ["j1.rank0.000001.jsonl"]


# c4 run --------------------------------------------------------------------------------

SHOW_PROCESS = """
import json, os, sys
print(json.dumps({"pid": os.getpid(),
                  "env": {k: v for k, v in os.environ.items() if k.startswith("C4_")}}))
sys.exit(int(sys.argv[1]))
"""


def c4_run(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "c4.cli", "run", *args],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_c4_run_execs_the_command_with_the_options_as_variables(tmp_path: Path) -> None:
    process = c4_run(
        "--job",
        "j7",
        "--rank",
        "0",
        "--node",
        "node-1",
        "--handoff",
        str(tmp_path),
        "--",
        sys.executable,
        "-c",
        SHOW_PROCESS,
        "7",
        cwd=tmp_path,
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 7, err  # the command's exit status
    shown = json.loads(out)
    assert shown["pid"] == process.pid  # exec: the same process
    assert shown["env"] == {
        "C4_INSTRUMENT": "1",
        "C4_JOB": "j7",
        "C4_RANK": "0",
        "C4_NODE": "node-1",
        "C4_HANDOFF_DIR": str(tmp_path),
    }
    assert err == ""


def test_c4_run_without_a_runnable_command(tmp_path: Path) -> None:
    missing = c4_run("--", str(tmp_path / "no-such-program"), cwd=tmp_path)
    _, err = missing.communicate(timeout=120)
    assert missing.returncode == 127
    assert c4_lines(err) == [
        f"c4: run: cannot run '{tmp_path / 'no-such-program'}': No such file or directory"
    ]
    nothing = c4_run("--job", "j", cwd=tmp_path)
    _, err = nothing.communicate(timeout=120)
    assert nothing.returncode == 2 and "no command given" in err
    bad = c4_run("--rank", "x", "--", "true", cwd=tmp_path)
    _, err = bad.communicate(timeout=120)
    assert bad.returncode == 2 and "'x' is not a non-negative integer" in err


# The member record, handed to the agent ------------------------------------------------


class _Producer:
    """What the publisher asks of librdkafka's producer, recording the records."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.records: list[tuple[str, bytes, bytes]] = []
        _Producer.last = self

    last: _Producer

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        self.records.append((topic, key, value))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


@pytest.mark.parametrize("pack", [False, True])
def test_the_agent_publishes_a_member_record_to_the_job_topic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack: bool
) -> None:
    from producers import publisher as publisher_module

    monkeypatch.setattr(publisher_module, "Producer", _Producer)
    member = Member(v=1, kind="member", job="4242", ts_ns=1, rank=0, world_size=2, node="n0")
    ops = Ops(seq=(0,), op=("allreduce",), bytes=(64,), enter_ns=(1,), end_ns=(2,))
    collective = Collective.of(
        job="4242", comm="0", comm_size=2, rank=0, global_rank=0, ts_ns=3, ops=ops, node="n0"
    )
    sink = FolderSink(tmp_path, "4242.rank0")
    sink([member])
    sink([collective])
    sink.close()
    publisher = publisher_module.Publisher({}, "t.")
    reports: list[str] = []
    agent = Agent([HandoffSource(tmp_path)], publisher.publish, reports.append, pack=pack)
    assert agent.run_once() == 2
    assert reports == []
    records = _Producer.last.records
    assert records[0][:2] == ("t." + TOPICS_BY_KIND["member"].name, b"4242")
    assert TOPICS_BY_KIND["member"].name == "c4.job.v1"
    assert json.loads(records[0][2])["kind"] == "member"
    assert records[1][0] == "t.c4.collective.v1"
    assert json.loads(records[1][2])["kind"] == ("collectives" if pack else "collective")
