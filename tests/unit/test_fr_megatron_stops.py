"""Flight Recorder dumps in torch's real format (a 16-rank Megatron MoE job, timing off,
truncated ring buffers, no rank key): every stopped rank is named by its global rank, no
healthy rank is (issue 36)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from producers.fr_convert import convert
from producers.fr_dump import load_dump, read_dump_folder
from producers.fr_entries import entries_of, members_of
from producers.fr_stall import stopped_ranks
from schemas.codec import decode, encode
from schemas.messages import Collective, Diagnosis, Job, RankPlace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "flight_recorder"))

from moe_dumps import CASES, job_groups, write_case  # noqa: E402

JOB = "moe-7"


def run_c4(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args], input=stdin, capture_output=True, timeout=300
    )


def _findings(folder: Path, *convert_args: str, diagnose_args: tuple[str, ...] = ()) -> list[Any]:
    converted = run_c4("convert", "flight-recorder", str(folder), *convert_args)
    assert converted.returncode == 0, converted.stderr.decode()
    diagnosed = run_c4("diagnose", *diagnose_args, "-", stdin=converted.stdout)
    assert diagnosed.returncode == 0, diagnosed.stderr.decode()
    found = [decode(line) for line in diagnosed.stdout.splitlines()]
    return [d for d in found if isinstance(d, Diagnosis) and d.state == "firing"]


def _placement(tmp_path: Path) -> Path:
    """Four nodes of four GPUs: global rank r on node-00{r // 4}, GPU r % 4."""
    places = tuple(RankPlace(rank=r, node=f"node-00{r // 4}", gpu=r % 4) for r in range(16))
    job = Job(v=1, kind="job", job=JOB, ts_ns=0, state="running", ranks=places, comms={})
    path = tmp_path / "job.json"
    path.write_bytes(encode(job) + b"\n")
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_stopped_rank_is_named_by_its_global_rank_and_no_other(
    tmp_path: Path, case: str
) -> None:
    stopped = write_case(tmp_path / "dumps", case)
    findings = _findings(tmp_path / "dumps", "--job", JOB)
    named = {s.id for d in findings for s in d.suspects}
    assert named == {f"{JOB}/rank{rank}" for rank in stopped}, (case, findings)
    assert {d.class_ for d in findings} == ({"noncomm_hang"} if stopped else set())
    assert {r for d in findings for r in d.evidence["suspect_global_ranks"]} == set(stopped)


@pytest.mark.parametrize("where", ["convert", "diagnose"])
def test_with_a_placement_the_stopped_ranks_are_named_by_their_gpus(
    tmp_path: Path, where: str
) -> None:
    # Ranks 12 and 14 (expert-parallel group {12, 13, 14, 15}): index 0 and 2 of that group,
    # which must not come out as global ranks 0 and 2.
    stopped = write_case(tmp_path / "dumps", "ep_gil_ranks12_14")
    placement = str(_placement(tmp_path))
    if where == "convert":
        findings = _findings(tmp_path / "dumps", "--placement", placement)
    else:
        findings = _findings(tmp_path / "dumps", "--job", JOB, diagnose_args=("--jobs", placement))
    assert stopped == [12, 14]
    assert {s.id for d in findings for s in d.suspects} == {"node-003/gpu0", "node-003/gpu2"}
    assert {s.type for d in findings for s in d.suspects} == {"gpu"}
    assert {r for d in findings for r in d.evidence["suspect_global_ranks"]} == {12, 14}


def test_the_dumps_have_the_shape_torch_writes(tmp_path: Path) -> None:
    write_case(tmp_path / "dumps", "ep_gpu_ranks12_14")
    groups = {g.name: g for g in job_groups()}
    lengths = []
    for rank in range(16):
        path = tmp_path / "dumps" / f"nccl_trace_rank_{rank}"
        dump = load_dump(path.read_bytes(), str(path))
        assert "rank" not in dump  # the rank is the file name's
        mine = sorted((g for g in groups.values() if rank in g.ranks), key=lambda g: int(g.name))
        assert set(dump["pg_config"]) == {g.name for g in mine}  # only its own groups
        for name, config in dump["pg_config"].items():
            assert name.isdigit() and config["name"] == name
            assert config["ranks"] == str(list(groups[name].ranks))  # "[12, 13, 14, 15]"
        entries = dump["entries"]
        lengths.append(len(entries))
        assert {e["state"] for e in entries} == {"scheduled"}
        assert all(e["time_discovered_started_ns"] is None for e in entries)
        assert all(e["time_discovered_completed_ns"] is None for e in entries)
        # pg_status is keyed by the rank's own index of the group, as entries' pg_id.
        local = {str(e["pg_id"]): e["process_group"][0] for e in entries}
        assert all(mine[int(pg_id)].name == name for pg_id, name in local.items())
        for status in dump["pg_status"].values():
            assert status["last_started_collective"] == -1
            assert status["last_completed_collective"] <= status["last_enqueued_collective"]
        # p2p entries: their own p2p_seq_id, the group's collective_seq_id unchanged.
        p2p = [e for e in entries if e["is_p2p"]]
        assert all(e["p2p_seq_id"] > 0 and e["collective_seq_id"] == 0 for e in p2p)
    assert min(lengths) >= 8 and max(lengths) <= 43 and len(set(lengths)) > 1


def test_a_rank_without_entries_of_a_group_still_reports_in_it_by_global_rank(
    tmp_path: Path,
) -> None:
    write_case(tmp_path / "dumps", "ep_gil_ranks12_14")
    dumps = read_dump_folder(tmp_path / "dumps")
    held = {(d.rank, e["process_group"][0]) for d in dumps for e in d.dump["entries"]}
    result = convert(dumps, JOB)
    reporting = {(m.global_rank, m.comm) for m in result.messages if isinstance(m, Collective)}
    active = {m.comm for m in result.messages if len(m.ops)}
    for group in job_groups():
        if group.name not in active:
            continue  # no member's ring buffer kept any of it: no communicator to report in
        for index, rank in enumerate(group.ranks):
            assert (rank, group.name) in reporting
            sent = [m for m in result.messages if m.comm == group.name and m.global_rank == rank]
            assert {m.rank for m in sent} == {index}
    # Some membership is known from pg_config alone: its ring buffer kept none of it.
    assert any(
        (rank, g.name) not in held for g in job_groups() if g.name in active for rank in g.ranks
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_pg_status_tells_how_far_a_rank_went_where_its_ring_buffer_kept_nothing(
    tmp_path: Path, case: str
) -> None:
    # Two to four entries per rank: most groups' progress is known only from pg_status,
    # keyed by each rank's own index of its groups (paired with pg_config's names by order
    # where no entry of the group is left to pair them).
    stopped = write_case(tmp_path / "dumps", case, ring=(2, 4))
    dumps = read_dump_folder(tmp_path / "dumps")
    members = members_of(dumps)
    skipped: list[str] = []
    entries = [e for f, d in enumerate(dumps) for e in entries_of(f, d, members, skipped)]
    assert skipped == []
    assert sorted(stopped_ranks(dumps, entries, members)) == stopped
