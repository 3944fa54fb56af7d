"""Slurm as the action workers see it: drain, resume, requeue and idle nodes, through its CLI.

Every call is checked against Slurm's own state first, so that a worker that crashed half
way and runs the step again changes nothing twice:
- a drain's reason starts with ``c4:<diagnosis id>``, so people and tools can tell c4's
  drains from others; a node already drained (by c4 or by a person) is not drained again,
  and a person's reason is never overwritten;
- a resume happens only while the node's reason still carries c4's prefix: a node a person
  drained stays drained;
- before a requeue the job's ``AdminComment`` records ``c4:requeue=<diagnosis>@<restarts>``;
  a job whose restart count has gone past that mark, or that is pending again, was requeued
  already for this diagnosis.
Queries always run; with ``dry_run`` the commands that change something are printed instead.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from actions import SchedulerError

log = logging.getLogger("c4.actions.slurm")

REASON_PREFIX = "c4:"
MARK_PREFIX = "c4:requeue="
# Slurm keeps a reason up to a few hundred bytes; a long component list is cut, not refused.
MAX_REASON = 200
COMMAND_TIMEOUT_S = 30.0
# What scontrol says when the controller cannot be reached: worth a retry.
UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Zero Bytes were transmitted|Transport endpoint",
    re.I,
)
ENDED_STATES = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
)
_FIELD = re.compile(r"(\w+)=(\S*)")


class SlurmError(SchedulerError):
    """A Slurm command failed; ``retryable`` when the controller could not be reached."""


@dataclass(frozen=True, slots=True)
class Output:
    """What one command printed and how it exited."""

    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one Slurm command (an argument list, never a shell line)."""

    def __call__(self, args: Sequence[str]) -> Output:
        """Run it and say how it went."""


class CommandRunner:
    """The real one: the Slurm commands on PATH, with ``SLURM_CONF`` when one is given."""

    def __init__(self, conf: str | None = None, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self._env = dict(os.environ) | ({"SLURM_CONF": conf} if conf else {})
        self._timeout_s = timeout_s

    def __call__(self, args: Sequence[str]) -> Output:
        program = shutil.which(args[0])
        if program is None:
            message = f"{args[0]} not found on PATH (is Slurm's client installed?)"
            raise SlurmError(message, retryable=False)
        try:
            done = subprocess.run(  # noqa: S603 - an argument list, no shell
                [program, *args[1:]],
                capture_output=True,
                text=True,
                env=self._env,
                timeout=self._timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            message = f"{' '.join(args)}: no answer within {self._timeout_s:g} s"
            raise SlurmError(message, retryable=True) from error
        return Output(done.returncode, done.stdout, done.stderr)


class Answer(StrEnum):
    """How a change request ended, Slurm's state checked first."""

    DONE = "done"
    ALREADY = "already"  # the change was made before (a retry, or another worker)
    HELD = "held"  # a person drained the node: c4 leaves it alone
    NOT_DRAINED = "not_drained"
    ENDED = "ended"  # the job is over: nothing to requeue
    KEPT = "kept"  # drained by c4 for another part of the node: stays drained


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as ``sinfo`` reports it."""

    name: str
    state: str  # sinfo's long form: idle, mixed, allocated, drained, draining, down...
    reason: str

    @property
    def drained(self) -> bool:
        """Drained or draining: no new job lands on it."""
        return self.state.rstrip("*~#!%$@^-").startswith(("drain", "drng"))

    @property
    def drained_by_c4(self) -> bool:
        """Drained, with c4's prefix on its reason."""
        return self.drained and self.reason.startswith(REASON_PREFIX)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One job as ``scontrol show job`` reports it."""

    job_id: str
    state: str
    restarts: int
    nodes: str
    excluded: str
    admin_comment: str
    # When the current run was queued (Slurm moves SubmitTime to the requeue), in Unix seconds
    # on the controller's clock, whole seconds; None when Slurm gave none.
    submitted_s: int | None = None

    def mark(self) -> tuple[str, int] | None:
        """The (diagnosis, restarts) of c4's last requeue mark, if the comment holds one."""
        if not self.admin_comment.startswith(MARK_PREFIX):
            return None
        diagnosis, _, restarts = self.admin_comment[len(MARK_PREFIX) :].partition("@")
        return (diagnosis, int(restarts)) if restarts.isdigit() else None


def drain_reason(diagnosis: str, cls: str, component: str) -> str:
    """The reason c4 gives a drain: its prefix, the diagnosis, its class and component."""
    reason = f"{REASON_PREFIX}{diagnosis} {cls} {component}"
    return reason[:MAX_REASON]


def drained_for(reason: str) -> str | None:
    """The component a c4 drain reason names (its third word), if it is c4's."""
    words = reason.split()
    return words[2] if reason.startswith(REASON_PREFIX) and len(words) >= 3 else None


def parse_fields(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of scontrol's output (values without spaces, which c4 writes)."""
    return dict(_FIELD.findall(text))


def parse_job(text: str) -> JobInfo:
    """``scontrol show job -o`` output as a JobInfo."""
    fields = parse_fields(text)
    if "JobId" not in fields:
        message = f"no job in scontrol's answer: {text.strip()[:200]!r}"
        raise SlurmError(message, retryable=False)
    restarts = fields.get("Restarts", "0")
    return JobInfo(
        job_id=fields["JobId"],
        state=fields.get("JobState", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        nodes=_none_as_empty(fields.get("NodeList", "")),
        excluded=_none_as_empty(fields.get("ExcNodeList", "")),
        admin_comment=_none_as_empty(fields.get("AdminComment", "")),
        submitted_s=_local_time(fields.get("SubmitTime", "")),
    )


def _local_time(value: str) -> int | None:
    """A Slurm time (``2026-12-05T00:13:12``, the controller's local time) in Unix seconds."""
    try:
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        return None


def _none_as_empty(value: str) -> str:
    return "" if value.lower() in ("(null)", "none") else value


class Slurm:
    """Drain, resume, requeue and spares, each idempotent against Slurm's own state."""

    def __init__(self, runner: Runner, *, dry_run: bool = False, settle_s: float = 15.0) -> None:
        self._run = runner
        self.dry_run = dry_run
        self.settle_s = settle_s

    def node(self, name: str) -> NodeInfo:
        """One node's state and reason."""
        out = self._query(["sinfo", "-h", "-N", "-n", name, "-o", "%N|%T|%E"])
        for line in out.splitlines():
            node, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            if node == name:
                return NodeInfo(name, state.strip().lower(), _none_as_empty(reason.strip()))
        message = f"node {name!r} is not in Slurm's node list"
        raise SlurmError(message, retryable=False)

    def idle_nodes(self) -> list[str]:
        """The nodes Slurm reports idle (not drained), in its order: the spares."""
        out = self._query(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N|%T"])
        seen: dict[str, None] = {}
        for line in out.splitlines():
            node, _, state = line.partition("|")
            if node and not NodeInfo(node, state.strip().lower(), "").drained:
                seen.setdefault(node, None)
        return list(seen)

    def drain(self, name: str, reason: str) -> Answer:
        """Drain a node with c4's reason, unless it is drained already."""
        node = self.node(name)
        if node.drained:
            return Answer.ALREADY if node.drained_by_c4 else Answer.HELD
        self._change(["scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"])
        return Answer.DONE

    def resume(self, name: str, component: str | None = None) -> Answer:
        """Resume a node that c4 drained; a node a person drained is left alone, and so is
        one c4 drained for another part than ``component`` (a GPU of it, say)."""
        node = self.node(name)
        if not node.drained:
            return Answer.NOT_DRAINED
        if not node.drained_by_c4:
            return Answer.HELD
        if component is not None and drained_for(node.reason) not in (component, name):
            return Answer.KEPT
        self._change(["scontrol", "update", f"NodeName={name}", "State=RESUME"])
        return Answer.DONE

    def job(self, job_id: str) -> JobInfo:
        """One job's state, restart count, nodes and c4's mark."""
        return parse_job(self._query(["scontrol", "-o", "show", "job", job_id]))

    def requeue(
        self,
        job_id: str,
        diagnosis: str,
        exclude: Sequence[str] = (),
        requeued: Callable[[], None] = lambda: None,
    ) -> Answer:
        """Requeue a job once for a diagnosis, then keep it off ``exclude`` and let it start.

        Slurm holds a requeued job for a while (its begin time); the hold is lifted here,
        since the nodes that failed are drained or excluded already.
        """
        info = self.job(job_id)
        mark = info.mark()
        if (
            mark is not None
            and mark[0] == diagnosis
            and (info.restarts > mark[1] or info.state == "PENDING")
        ):
            if info.state not in ENDED_STATES and info.state != "RUNNING":
                # Requeued, not started again: a crash between the requeue and what follows.
                self._keep_off(info, exclude)
            return Answer.ALREADY
        if info.state in ENDED_STATES:
            return Answer.ENDED
        comment = f"{MARK_PREFIX}{diagnosis}@{info.restarts}"
        self._change(["scontrol", "update", f"JobId={job_id}", f"AdminComment={comment}"])
        self._change(["scontrol", "requeue", job_id])
        requeued()  # a test's crash point: requeued, hold not lifted yet
        self._keep_off(info, exclude)
        return Answer.DONE

    def _pending(self, job_id: str) -> JobInfo:
        """The job once Slurm has it pending again (its tasks take a moment to end)."""
        deadline = time.monotonic() + self.settle_s
        while True:
            info = self.job(job_id)
            if info.state == "PENDING":
                return info
            if time.monotonic() >= deadline:
                message = (
                    f"job {job_id} is {info.state}, not pending, {self.settle_s:g} s after requeue"
                )
                raise SlurmError(message, retryable=True)
            time.sleep(0.2)

    def _keep_off(self, info: JobInfo, exclude: Sequence[str]) -> None:
        """Keep a requeued job off ``exclude`` and lift Slurm's hold on its begin time."""
        if not self.dry_run:
            # Only a pending job's excluded nodes and begin time can change.
            info = self._pending(info.job_id)
        already = self.expand(info.excluded)
        if set(exclude) - set(already):
            nodes = ",".join(sorted({*already, *exclude}))
            self._change(["scontrol", "update", f"JobId={info.job_id}", f"ExcNodeList={nodes}"])
        if not self.dry_run:
            # slurmd refuses a launch credential made in the second it revoked the job's last
            # one ("Job credential revoked": the job FAILS): start it in a later second.
            time.sleep(math.floor(time.time()) + 1 - time.time())
        self._change(["scontrol", "update", f"JobId={info.job_id}", "StartTime=now"])

    def expand(self, hostlist: str) -> list[str]:
        """A Slurm host list (``node-[000-003]``) as names."""
        if not hostlist:
            return []
        out = self._query(["scontrol", "show", "hostnames", hostlist])
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _query(self, args: Sequence[str]) -> str:
        out = self._run(args)
        if out.returncode != 0:
            raise _failure(args, out)
        return out.stdout

    def _change(self, args: Sequence[str]) -> None:
        if self.dry_run:
            print(shlex.join(args), file=sys.stdout)
            return
        log.info("slurm: %s", " ".join(args))
        out = self._run(args)
        if out.returncode != 0:
            raise _failure(args, out)


def _failure(args: Sequence[str], out: Output) -> SlurmError:
    said = (out.stderr or out.stdout).strip().splitlines()
    line = said[-1] if said else f"exit status {out.returncode}"
    retryable = any(UNREACHABLE.search(text) for text in said)
    return SlurmError(f"{shlex.join(args)[:120]}: {line}", retryable=retryable)
