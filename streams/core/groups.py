"""A job's communicators and placement: where each member of a group runs."""

from __future__ import annotations

from schemas.messages import RankPlace
from streams.core.comm import CommTracker, Member
from streams.core.findings import SuspectScore
from streams.core.places import gpu_id, port_id, rank_id


class JobGroups:
    """One job's communicator trackers and rank placement, and what they say of members."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.comms: dict[str, CommTracker] = {}
        self.placement: dict[int, RankPlace] = {}
        # Moves whenever the placement is replaced: what was read of it holds until then.
        self.placement_version = 0
        self._ports_by_comm: dict[str, tuple[tuple[int, int], CommTracker, list[str | None]]] = {}

    def place(self, member: Member) -> tuple[str | None, int | None, str | None]:
        """A member's (node, GPU, port), from its reports or else the job's placement."""
        node, gpu, port = member.node, member.gpu, member.port
        if member.global_rank is not None:
            place = self.placement.get(member.global_rank)
            if place is not None:
                node = node or place.node
                gpu = gpu if gpu is not None else place.gpu
                port = port or place.port
        return node, gpu, port

    def rank_suspect(self, member: Member, score: float) -> SuspectScore:
        """A member as a suspect: its GPU where known, else its rank."""
        node, gpu, _ = self.place(member)
        if node is not None and gpu is not None:
            return SuspectScore("gpu", gpu_id(node, gpu), score)
        return SuspectScore("rank", rank_id(self.job, member.global_rank or 0), score)

    def member_ports(self, tracker: CommTracker) -> list[str | None]:
        """The NIC port (global id) of each member of a group, kept while its places hold."""
        stamp = (tracker.place_version, self.placement_version)
        known = self._ports_by_comm.get(tracker.comm)
        if known is not None and known[0] == stamp and known[1] is tracker:
            return known[2]
        ports = [self.port_of(member) for member in tracker.members]
        self._ports_by_comm[tracker.comm] = (stamp, tracker, ports)
        return ports

    def port_of(self, member: Member) -> str | None:
        """A member's NIC port (global id), None when its node or port is unknown."""
        node, _, port = self.place(member)
        return port_id(node, port) if node is not None and port is not None else None

    def latest_seen_ns(self) -> int:
        """The latest report of any member of any group; -1 before the first."""
        return max((tracker.latest_seen_ns for tracker in self.comms.values()), default=-1)
