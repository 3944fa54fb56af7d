"""``c4 run [options] -- CMD ARGS...``: run a training command instrumented, unchanged.

Sets ``C4_INSTRUMENT=1`` and one ``C4_*`` variable per option given, then replaces itself
with the command (``exec``: the same process id, signals reach the command directly, the
exit status is the command's). Every Python process of the command that inherits the
variables (``srun c4 run -- python train.py``, ``c4 run -- torchrun ...`` and its workers,
``mp.spawn`` children) is armed by the ``c4-instrument.pth`` file the c4 package installs:
when it initialises torch.distributed, the rank reports where it runs (a ``member``
message) and its collective operations are recorded, both to the handoff folder the node
agent publishes from (``c4 agent --handoff DIR``). See `producers.autoinstrument`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import site
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from c4_autoinstrument import PTH_NAME
from producers.launch_env import ENABLE, EXPLICIT

if TYPE_CHECKING:
    from c4.settings import Settings

# Options -> the variable each sets (producers.launch_env.EXPLICIT: they win over what the
# hook derives from Slurm and torchrun).
OPTIONS = {
    "job": EXPLICIT["job"],
    "handoff": EXPLICIT["handoff"],
    "rank": EXPLICIT["rank"],
    "local_rank": EXPLICIT["local_rank"],
    "world_size": EXPLICIT["world_size"],
    "node": EXPLICIT["node"],
    "restart": EXPLICIT["restart"],
    "port": EXPLICIT["port"],
    "interval": EXPLICIT["interval"],
}
Exec = Callable[[str, list[str], dict[str, str]], NoReturn]


def command_of(args: argparse.Namespace) -> list[str]:
    """The command to run: what follows the options (a leading ``--`` dropped)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    return command


def child_env(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the switch on and every option given as its variable."""
    child = dict(env)
    child[ENABLE] = "1"
    for option, variable in OPTIONS.items():
        value = getattr(args, option, None)
        if value is not None:
            child[variable] = str(value)
    return child


def hook_installed() -> bool:
    """Whether this interpreter's site folders hold ``c4-instrument.pth``."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return any((Path(folder) / PTH_NAME).is_file() for folder in folders)


def setup_problem() -> str | None:
    """Why a Python command run with this c4 would not be instrumented, as one line (the
    hook lives in the Python that has c4 installed: a training Python without c4 installed
    is not armed); None when this Python has both the hook and torch."""
    if not hook_installed():
        return (
            f"{PTH_NAME} is not installed for {sys.executable} (reinstall c4: pip install . "
            "or pip install -e .): a Python command runs uninstrumented"
        )
    if importlib.util.find_spec("torch") is None:
        return (
            f"instrumentation off for this Python: torch is not installed for {sys.executable};"
            " a command running another Python is instrumented only if c4 is installed there"
        )
    return None


def _run(
    args: argparse.Namespace,
    settings: Settings,
    execute: Exec = os.execvpe,
) -> int:
    del settings  # the command reports through the node agent, not to Kafka itself
    command = command_of(args)
    if not command:
        print("c4: run: no command given (c4 run [options] -- CMD ARGS...)", file=sys.stderr)
        return 2
    problem = setup_problem()
    if problem is not None:
        print(f"c4: run: {problem}", file=sys.stderr)
    env = child_env(args, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        execute(command[0], command, env)
    except OSError as error:
        print(f"c4: run: cannot run {command[0]!r}: {error.strerror or error}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126


def _non_negative(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        message = f"{text!r} is not a non-negative integer"
        raise argparse.ArgumentTypeError(message)
    return int(text)


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        message = f"{text!r} is not a positive integer"
        raise argparse.ArgumentTypeError(message)
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.01 <= value <= 3600:
        message = f"{text!r} is not a number of seconds in [0.01, 3600]"
        raise argparse.ArgumentTypeError(message)
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="run a training command with zero-code torch instrumentation (exec, same pid)",
        description="Run CMD with C4_INSTRUMENT=1: each rank reports where it runs and "
        "its collectives to the node agent's handoff folder. Options win over what Slurm "
        "and torchrun say. e.g. srun c4 run -- python train.py; c4 run --job j1 -- "
        "torchrun --nproc-per-node 8 train.py",
    )
    parser.add_argument(
        "--job", help="job id (default SLURM_JOB_ID, else torchrun's TORCHELASTIC_RUN_ID)"
    )
    parser.add_argument(
        "--handoff",
        help="folder the node agent publishes from (c4 agent --handoff; default "
        "<C4_STACK_DIR>/handoff)",
    )
    parser.add_argument(
        "--rank",
        type=_non_negative,
        help="global rank, for a command that is one rank (default: torch.distributed's)",
    )
    parser.add_argument(
        "--local-rank", type=_non_negative, help="rank on this node (default LOCAL_RANK)"
    )
    parser.add_argument(
        "--world-size",
        type=_positive,
        help="ranks in the job, for a command that is one rank (default: torch.distributed's)",
    )
    parser.add_argument("--node", help="this node's name (default SLURMD_NODENAME, host name)")
    parser.add_argument(
        "--restart",
        type=_non_negative,
        help="the job's restart count (default SLURM_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT)",
    )
    parser.add_argument(
        "--port", help="this rank's NIC port, e.g. mlx5_1:1 (default: NCCL_IB_HCA's one device)"
    )
    parser.add_argument(
        "--interval", type=_seconds, help="seconds between the ranks' reports (default 1)"
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the command and its arguments, after --"
    )
    parser.set_defaults(handler=_run)
