"""Who a training process is, from Slurm's, torchrun's and c4's own variables (explicit wins),
and where its GPU is on the node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from producers.autoinstrument import member_message, node_gpu
from producers.launch_env import (
    LaunchSettingError,
    enabled,
    handoff_dir,
    interval_s,
    port_of,
    resolve_identity,
    writer_name,
)

SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURMD_NODENAME": "node-002",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_JOB_NODELIST": "node-[000-003]",
}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "rdzv-7",
    "RANK": "3",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "16",
    "TORCHELASTIC_RESTART_COUNT": "1",
}


def test_slurm_alone() -> None:
    identity = resolve_identity(SLURM, "host-a")
    assert (identity.job, identity.rank, identity.local_rank, identity.world_size) == (
        "4242",
        5,
        1,
        8,
    )
    assert (identity.node, identity.host, identity.restart) == ("node-002", "host-a", 2)
    assert identity.job_nodes == ("node-000", "node-001", "node-002", "node-003")
    assert identity.explicit == frozenset()


def test_torchrun_alone() -> None:
    identity = resolve_identity(TORCHRUN, "host-a")
    assert (identity.job, identity.rank, identity.local_rank, identity.world_size) == (
        "rdzv-7",
        3,
        3,
        16,
    )
    assert (identity.node, identity.restart, identity.job_nodes) == ("host-a", 1, None)


def test_torchrun_inside_slurm_wins_for_ranks_and_slurm_names_the_job_and_node() -> None:
    identity = resolve_identity({**SLURM, **TORCHRUN}, "host-a")
    assert (identity.job, identity.rank, identity.local_rank, identity.world_size) == (
        "4242",
        3,
        3,
        16,
    )
    assert identity.node == "node-002"
    # Slurm requeued the job twice, torchrun restarted the workers once since: the count
    # only grows across both kinds of restart.
    assert identity.restart == 2 * 1000 + 1
    later = resolve_identity(
        {**SLURM, **TORCHRUN, "SLURM_RESTART_COUNT": "3", "TORCHELASTIC_RESTART_COUNT": "0"}, "h"
    )
    assert later.restart > identity.restart


def test_explicit_options_win() -> None:
    explicit = {
        "C4_JOB": "mine",
        "C4_RANK": "7",
        "C4_LOCAL_RANK": "0",
        "C4_WORLD_SIZE": "9",
        "C4_NODE": "node-x",
        "C4_RESTART": "4",
        "C4_PORT": "mlx5_3:1",
    }
    identity = resolve_identity({**SLURM, **TORCHRUN, "NCCL_IB_HCA": "mlx5_0", **explicit}, "h")
    assert (identity.job, identity.rank, identity.local_rank, identity.world_size) == (
        "mine",
        7,
        0,
        9,
    )
    assert (identity.node, identity.restart, identity.port) == ("node-x", 4, "mlx5_3:1")
    assert identity.explicit == {
        "job",
        "rank",
        "local_rank",
        "world_size",
        "node",
        "restart",
        "port",
    }


def test_torch_distributed_is_the_truth_for_rank_and_world_size_unless_given() -> None:
    derived = resolve_identity({**SLURM, **TORCHRUN}, "h")
    in_group, notes = derived.in_group(11, 12)
    assert (in_group.rank, in_group.world_size, notes) == (11, 12, [])
    given = resolve_identity({**TORCHRUN, "C4_RANK": "3", "C4_WORLD_SIZE": "16"}, "h")
    agreed, notes = given.in_group(3, 16)
    assert (agreed.rank, agreed.world_size, notes) == (3, 16, [])
    differing, notes = given.in_group(4, 16)
    assert differing.rank == 3  # explicit still wins; the disagreement is said
    assert notes == ["C4_RANK=3 but torch.distributed's rank is 4"]


def test_nothing_known() -> None:
    identity = resolve_identity({}, "host-a")
    assert (identity.job, identity.rank, identity.world_size, identity.local_rank) == (
        None,
        None,
        None,
        None,
    )
    assert (identity.node, identity.host, identity.restart, identity.port) == (
        "host-a",
        "host-a",
        0,
        None,
    )
    # torchrun's run id when none was given is no job id
    assert resolve_identity({"TORCHELASTIC_RUN_ID": "none"}, "h").job is None


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"C4_RANK": "abc"}, "C4_RANK='abc' is not a non-negative integer"),
        ({"RANK": "-1"}, "RANK='-1'"),
        ({"C4_WORLD_SIZE": "0"}, "world size 0 is not positive"),
        ({"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT"),
    ],
)
def test_unusable_values_are_a_setting_error(env: dict[str, str], problem: str) -> None:
    with pytest.raises(LaunchSettingError, match=problem.replace("(", r"\(")):
        resolve_identity(env, "h")


def test_a_nodelist_not_in_slurm_syntax_leaves_job_nodes_out() -> None:
    assert resolve_identity({"SLURM_JOB_NODELIST": "n[1-"}, "h").job_nodes is None
    assert resolve_identity({"SLURM_NODELIST": "n[1-2]"}, "h").job_nodes == ("n1", "n2")


@pytest.mark.parametrize(
    ("env", "port"),
    [
        ({"NCCL_IB_HCA": "mlx5_1"}, "mlx5_1:1"),
        ({"NCCL_IB_HCA": "mlx5_1:2"}, "mlx5_1:2"),
        ({"NCCL_IB_HCA": "=mlx5_4:1"}, "mlx5_4:1"),
        ({"NCCL_IB_HCA": "mlx5_0,mlx5_1"}, None),  # several: not this rank's one
        ({"NCCL_IB_HCA": "^mlx5_0"}, None),  # the ones not to use
        ({}, None),
        ({"NCCL_IB_HCA": "mlx5_0,mlx5_1", "C4_PORT": "mlx5_1:1"}, "mlx5_1:1"),
    ],
)
def test_port(env: dict[str, str], port: str | None) -> None:
    assert port_of(env) == port


def test_switch_handoff_folder_interval_and_writer_name(tmp_path: Path) -> None:
    assert not enabled({}) and not enabled({"C4_INSTRUMENT": "0"})
    assert not enabled({"C4_INSTRUMENT": " off "}) and not enabled({"C4_INSTRUMENT": ""})
    assert enabled({"C4_INSTRUMENT": "1"}) and enabled({"C4_INSTRUMENT": "yes"})
    assert handoff_dir({"C4_HANDOFF_DIR": str(tmp_path)}) == tmp_path
    assert handoff_dir({"C4_STACK_DIR": str(tmp_path)}) == tmp_path / "handoff"
    assert handoff_dir({}) == Path.home() / ".cache" / "c4" / "handoff"
    assert interval_s({}) == 1.0
    assert interval_s({"C4_INTERVAL_S": "0.25"}) == 0.25
    for bad in ("0", "abc", "nan", "1e9"):
        with pytest.raises(LaunchSettingError, match="C4_INTERVAL_S"):
            interval_s({"C4_INTERVAL_S": bad})
    assert writer_name("4242", 3) == "4242.rank3"
    assert writer_name("a/b*c", 0) == "a_b_c.rank0"


def test_member_message_of_an_identity() -> None:
    identity, _ = resolve_identity({**SLURM, "NCCL_IB_HCA": "mlx5_1"}, "host-a").in_group(5, 8)
    member = member_message(identity, 1, "GPU-1234")
    assert (member.job, member.rank, member.world_size, member.node, member.host) == (
        "4242",
        5,
        8,
        "node-002",
        "host-a",
    )
    assert (member.local_rank, member.gpu, member.gpu_uuid, member.port, member.restart) == (
        1,
        1,
        "GPU-1234",
        "mlx5_1:1",
        2,
    )
    assert member.job_nodes == ("node-000", "node-001", "node-002", "node-003")


class _FakeNvml:
    """pynvml's calls the GPU lookup makes, over a node of 4 GPUs."""

    def __init__(self, broken: bool = False) -> None:
        self.broken, self.shutdowns = broken, 0

    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:  # noqa: N802 -- pynvml's names
        if self.broken:
            message = "Driver Not Loaded"
            raise self.NVMLError(message)

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if not 0 <= index < 4:
            message = "Invalid Argument"
            raise self.NVMLError(message)
        return index

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:  # noqa: N802
        return f"GPU-0000000{handle}-aaaa".encode()


def test_the_gpu_index_on_the_node_goes_through_cuda_visible_devices() -> None:
    nvml = _FakeNvml()
    assert node_gpu(1, None, nvml) == (1, "GPU-00000001-aaaa")
    assert nvml.shutdowns == 1
    assert node_gpu(0, "2,3", nvml) == (2, "GPU-00000002-aaaa")
    assert node_gpu(1, "GPU-00000003", nvml) == (None, None)  # index past the visible list
    assert node_gpu(0, "GPU-00000003", nvml) == (3, "GPU-00000003-aaaa")
    assert node_gpu(0, "MIG-abc", nvml) == (None, None)
    # No driver: the index still, no UUID.
    assert node_gpu(0, "2,3", _FakeNvml(broken=True)) == (2, None)
