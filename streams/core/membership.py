"""Placements discovered, not configured: a job's ``job`` message assembled from its ranks'
``member`` reports, and a ``ranks_missing`` finding for a world that never completes.

Each instrumented rank reports where it runs when its process group comes up. Once every
rank of one restart has reported, the job's placement is published (state ``running``,
``comms`` empty: communicator members come from the collective messages). A report of a
higher restart count starts the next placement; one of a lower count is stale. A world
still incomplete ``join_bound_ns`` after its first report fires one finding that names the
ranks that never joined and the nodes they were meant to be on; it resolves when the world
completes or the job restarts. Event time only: a replay gives the same messages.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from schemas.base import C4Model
from schemas.messages import Diagnosis, DiagnosisClass, Job, Member, RankPlace
from streams.core.findings import FindingBook, OpenFinding, SuspectScore

RANKS_MISSING: DiagnosisClass = "ranks_missing"
# Ranks of a job start within seconds of each other; the bound leaves room for a slow
# import or a checkpoint load before the process group comes up.
DEFAULT_JOIN_BOUND_NS = 120 * 1_000_000_000
# The ranks a finding names one by one; the count says how many more are missing.
MAX_NAMED_RANKS = 64


@dataclass(slots=True)
class World:
    """The reports of one restart of one job."""

    restart: int
    world_size: int
    first_ns: int
    last_ns: int = 0
    members: dict[int, Member] = field(default_factory=dict)
    published: tuple[RankPlace, ...] | None = None
    findings: FindingBook = field(default_factory=FindingBook)

    def complete(self) -> bool:
        """Whether every rank of the world has reported."""
        return len(self.members) == self.world_size

    def places(self) -> tuple[RankPlace, ...]:
        """The reported places, by rank."""
        return tuple(self.members[rank].place() for rank in sorted(self.members))

    def missing(self) -> list[int]:
        """The ranks that have not reported, in order."""
        return [rank for rank in range(self.world_size) if rank not in self.members]

    def job_nodes(self) -> tuple[str, ...]:
        """The job's nodes as the newest report that carries them lists them."""
        newest = max(
            (m for m in self.members.values() if m.job_nodes),
            key=lambda m: m.ts_ns,
            default=None,
        )
        return () if newest is None or newest.job_nodes is None else newest.job_nodes


def meant_nodes(world: World, missing: list[int]) -> list[tuple[str, float]]:
    """The nodes the missing ranks were meant to be on, with the share of them on each.

    Both Slurm and torchrun place ranks in blocks, as many on each node: with the job's
    nodes known and a world that divides evenly, rank r belongs on node r // per_node.
    Otherwise the nodes of the job with no reporting rank at all are the ones named.
    """
    nodes = world.job_nodes()
    if not nodes or not missing:
        return []
    if world.world_size % len(nodes) == 0:
        per_node = world.world_size // len(nodes)
        counts = Counter(nodes[rank // per_node] for rank in missing)
        return [(node, counts[node] / len(missing)) for node in nodes if node in counts]
    reporting = {m.node for m in world.members.values()}
    silent = [node for node in nodes if node not in reporting]
    return [(node, 1.0 / len(silent)) for node in silent]


class MembershipBook:
    """Every job's current world, its published placement and its open finding."""

    def __init__(self, join_bound_ns: int = DEFAULT_JOIN_BOUND_NS) -> None:
        self.join_bound_ns = join_bound_ns
        self._worlds: dict[str, World] = {}

    def ingest(self, member: Member) -> list[C4Model]:
        """Take one report; the messages it causes (a placement, a resolved finding)."""
        world = self._worlds.get(member.job)
        out: list[C4Model] = []
        if world is not None and member.restart < world.restart:
            return out  # a report of a run that has been replaced
        if world is None or member.restart > world.restart or member.world_size != world.world_size:
            # A new run, or the world re-formed with another size: start over.
            if world is not None:
                out.extend(world.findings.resolve_all(member.ts_ns))
            world = World(member.restart, member.world_size, member.ts_ns)
            self._worlds[member.job] = world
        world.members[member.rank] = member
        world.last_ns = max(world.last_ns, member.ts_ns)
        if world.complete():
            places = world.places()
            if places != world.published:
                world.published = places
                out.append(_placement(member.job, world))
            out.extend(world.findings.resolve_all(world.last_ns))
        return out

    def check(self, now_ns: int) -> list[Diagnosis]:
        """Findings for worlds still incomplete past the bound (fired once each)."""
        out: list[Diagnosis] = []
        for job, world in self._worlds.items():
            if world.complete() or now_ns - world.first_ns < self.join_bound_ns:
                continue
            fired = _fire(job, world, now_ns)
            if fired is not None:
                out.append(fired)
        return out

    def replaced_before_ns(self, job: str) -> int | None:
        """Reports older than this are of a run the job's restart replaced: when its current
        run first reported, once it has restarted; None for a first run (a node's clock a
        little behind must not cost its first reports)."""
        world = self._worlds.get(job)
        return None if world is None or world.restart == 0 else world.first_ns

    def restart_of(self, job: str) -> int | None:
        """The job's current restart count as its ranks reported it."""
        world = self._worlds.get(job)
        return None if world is None else world.restart

    def placement(self, job: str) -> tuple[RankPlace, ...] | None:
        """The job's published placement, if its world has completed."""
        world = self._worlds.get(job)
        return None if world is None else world.published

    def close(self, job: str, now_ns: int) -> list[Diagnosis]:
        """The job stopped: forget it, resolving its open finding."""
        world = self._worlds.pop(job, None)
        return [] if world is None else world.findings.resolve_all(now_ns)

    def open_findings(self) -> list[OpenFinding]:
        """The ``ranks_missing`` findings firing now, of every job held here."""
        return [f for world in self._worlds.values() for f in world.findings.open_findings()]

    def drop(self, job: str) -> None:
        """Forget a job without a word (its partition moved to another worker)."""
        self._worlds.pop(job, None)

    def job_state(self, job: str) -> dict[str, Any] | None:
        """One job's world as plain data for a snapshot; None when none is held."""
        world = self._worlds.get(job)
        if world is None:
            return None
        return {
            "restart": world.restart,
            "world_size": world.world_size,
            "first_ns": world.first_ns,
            "last_ns": world.last_ns,
            "members": [m.model_dump(mode="json") for m in world.members.values()],
            "published": world.published is not None,
            "findings": world.findings.state(),
        }

    def restore_job(self, job: str, state: dict[str, Any]) -> None:
        """Take back what `job_state` gave (reports are validated again on the way in)."""
        world = World(state["restart"], state["world_size"], state["first_ns"])
        world.last_ns = state["last_ns"]
        for dumped in state["members"]:
            member = Member.model_validate(dumped)
            world.members[member.rank] = member
        if state["published"] and world.complete():
            world.published = world.places()
        world.findings.restore(state["findings"])
        self._worlds[job] = world


def _placement(job: str, world: World) -> Job:
    return Job(
        v=1,
        kind="job",
        job=job,
        ts_ns=world.last_ns,
        state="running",
        ranks=world.published or (),
        comms={},
    )


def _fire(job: str, world: World, now_ns: int) -> Diagnosis | None:
    missing = world.missing()
    suspects = [SuspectScore("rank", f"{job}/rank{r}", 1.0) for r in missing[:MAX_NAMED_RANKS]]
    suspects += [SuspectScore("node", node, share) for node, share in meant_nodes(world, missing)]
    evidence: dict[str, Any] = {
        "world_size": world.world_size,
        "reported": len(world.members),
        "missing": len(missing),
        "restart": world.restart,
    }
    return world.findings.fire(
        job,
        RANKS_MISSING,
        str(world.restart),
        world.first_ns,
        now_ns,
        tuple(suspects),
        evidence,
    )
