"""All detectors of one job: its communicators, nodes and open findings.

Each condition has its module: node liveness (`streams.core.nodes`), hangs
(`streams.core.hangs`), stragglers (`streams.core.stragglers`), slowdowns
(`streams.core.slowdowns`, with the job-wide port vote of `streams.core.vote` and the
connection throughput of `streams.core.throughput`); `JobDetector` feeds them and runs them
in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.messages import Collective, Diagnosis, Job, RankPlace
from streams.core.comm import CommTracker
from streams.core.findings import FindingBook
from streams.core.groups import JobGroups
from streams.core.hangs import HangCheck
from streams.core.nodes import NodeWatch
from streams.core.params import DetectorParams
from streams.core.places import PortHealth, Routes
from streams.core.rows import ConnRow, OpsRow, SeenRow
from streams.core.shard import SeqMerge, SeqPart
from streams.core.slowdowns import SlowdownCheck
from streams.core.slowpath import SlowPath
from streams.core.stragglers import StragglerCheck
from streams.core.throughput import ConnThroughputs
from streams.core.vote import JobVote


class JobDetector:
    """Turns one job's collective reports into findings."""

    def __init__(
        self,
        job: str,
        params: DetectorParams,
        ports: PortHealth,
        routes: Routes,
        *,
        fabric_known: bool = False,
        leaf_of: Mapping[str, str] | None = None,
    ) -> None:
        self.job = job
        self.params = params
        self.book = FindingBook()
        # The job's restart count of the run these reports are of, where they say it.
        self.run: int | None = None
        # Next check in this job's own data time, when its reports lag the clock.
        self.next_check_ns = 0
        self._groups = JobGroups(job)
        # Per group, the parts its shards handed on (a job spread over workers).
        self._merges: dict[str, SeqMerge] = {}
        # The placement as plain data and the version it is of: a snapshot of a job of
        # thousands of ranks dumped every rank's place anew each time (40 us a rank).
        self._placement_state: tuple[int, list[dict[str, Any]]] | None = None
        self._throughputs = ConnThroughputs(job, params, routes)
        self._nodes = NodeWatch(self._groups, params, self.book)
        self._hangs = HangCheck(self._groups, params, self.book, ports, self._nodes)
        self._stragglers = StragglerCheck(self._groups, params, self.book)
        # With a topology the fabric correlator names links from slow paths; without one,
        # this job names the two ports of its slow connections itself.
        vote = JobVote(
            self._groups,
            params,
            ports,
            routes,
            self._throughputs,
            fabric_known=fabric_known,
            leaf_of=leaf_of or {},
        )
        self._vote = vote
        self._slowdowns = SlowdownCheck(
            self._groups,
            params,
            self.book,
            ports,
            routes,
            self._throughputs,
            vote,
            fabric_known=fabric_known,
        )

    @property
    def comms(self) -> dict[str, CommTracker]:
        """The job's communicators by id."""
        return self._groups.comms

    @property
    def placement(self) -> dict[int, RankPlace]:
        """Where each global rank of the job runs, from its job messages."""
        return self._groups.placement

    @property
    def slow_paths(self) -> list[SlowPath]:
        """The job's slow connections that no port explains (as of the last check)."""
        return self._slowdowns.slow_paths

    @property
    def fabric_seen(self) -> list[tuple[SlowPath, bool]]:
        """The job's other connections over the fabric, each with whether it fell."""
        return self._vote.fabric_seen

    def data_now_ns(self) -> int:
        """The job's latest report (event time); -1 before the first."""
        return self._groups.latest_seen_ns()

    # --- input -----------------------------------------------------------------------
    def on_collective(self, message: Collective) -> None:
        """Take one rank's report."""
        self._nodes.on_report(message.ts_ns)
        self.tracker_of(message.comm, message.comm_size).ingest(message)
        self._stragglers.add(message)

    def tracker_of(self, comm: str, size: int) -> CommTracker:
        """The group's tracker (a new one for a group reported at another size)."""
        comms = self._groups.comms
        tracker = comms.get(comm)
        if tracker is None or tracker.size != size:
            tracker = CommTracker(self.job, comm, size, self.params)
            comms[comm] = tracker
            self._merges.pop(comm, None)
            self._throughputs.forget(comm)
            self._slowdowns.forget(comm)
        return tracker

    def on_report_times(self, times: list[int]) -> None:
        """The times of the job's reports a node stage took (in order): its liveness."""
        for ts_ns in times:
            self._nodes.on_report(ts_ns)

    def on_seen(self, seen: SeenRow) -> None:
        """A member's latest report of a barrier's interval, from where it runs."""
        comm, size, rank, global_rank, node, gpu, ts_ns = seen
        self.tracker_of(comm, size).take_seen(rank, ts_ns, global_rank, node, gpu)

    def on_conns(self, row: ConnRow) -> None:
        """A member's connection samples of one report."""
        comm, size, rank, ts_ns, peers, ports, sizes, busy = row
        self.tracker_of(comm, size).take_conns(rank, ts_ns, peers, ports, sizes, busy)

    def _merge(self, comm: str) -> SeqMerge | None:
        tracker = self._groups.comms.get(comm)
        if tracker is None:
            return None
        merge = self._merges.get(comm)
        if merge is None or merge.tracker is not tracker:
            merge = self._merges[comm] = SeqMerge(tracker)
        return merge

    def on_part(self, part: SeqPart) -> None:
        """A shard's part of an operation of one of the job's groups (`streams.core.shard`)."""
        merge = self._merge(part.comm)
        if merge is not None and merge.tracker.size == part.size:
            merge.add(part)

    def on_ops(self, row: OpsRow) -> None:
        """A member's operations of one report, for its compute windows."""
        global_rank, comm, ts_ns, seqs, names, sizes, enters, ends = row
        self._stragglers.compute.add(global_rank, comm, ts_ns, seqs, names, sizes, enters, ends)

    def merging_comms(self) -> set[str]:
        """The groups with operations pending from parts (rebuilt at each barrier)."""
        return {c for c, merge in self._merges.items() if merge.tracker.pending or merge.merging}

    def on_open(self, comm: str, opens: list[SeqPart], finished_ns: int) -> None:
        """A group's operations its shards' members are still in (all of them, each shard's
        latest finished operation): the tracker's pending operations anew."""
        merge = self._merge(comm)
        if merge is None:
            return
        merge.rebuild_pending(opens)
        if finished_ns > merge.tracker.finished_ns:
            merge.tracker.finished_ns = finished_ns

    def on_agent(self, node: str, ts_ns: int) -> None:
        """The node's agent was up at ``ts_ns`` (a batch it packed, empty or not)."""
        self._nodes.on_agent(node, ts_ns)

    def on_job(self, message: Job) -> None:
        """Learn the job's placement."""
        self._groups.placement = {place.rank: place for place in message.ranks}
        self._groups.placement_version += 1

    # --- checks ----------------------------------------------------------------------
    def check(self, now_ns: int) -> list[Diagnosis]:
        """Evaluate every condition at event time ``now_ns``; emit what changed.

        Judged no later than ``silent_after`` past this job's latest report: the clock may
        run ahead of a job's reports (live, other partitions' messages or a backlog being
        caught up; a broker outage, when only the timer moves it), and a conclusion needs
        the job's own reports to show it. A real hang leaves the live ranks' heartbeats.
        """
        out: list[Diagnosis] = []
        self._throughputs.new_check()
        data_now = self._groups.latest_seen_ns()
        if data_now >= 0:
            now_ns = min(now_ns, data_now + self.params.silent_after_ns)
        down = self._nodes.check(now_ns, out)
        hung = self._hangs.check(now_ns, down | self._nodes.coming_back(now_ns), out)
        self._stragglers.check(now_ns, hung or bool(down), out)
        if down:
            # Connections to a node that is gone stall: no slow path, no slowdown to blame.
            self._slowdowns.stand_down()
        else:
            self._slowdowns.check(now_ns, out)
        return out

    # --- snapshot ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """This job's detector state as plain data (placement, communicators, findings)."""
        return {
            "placement": self._placement_dump(),
            "comms": {comm: tracker.state() for comm, tracker in self.comms.items()},
            "findings": self.book.state(),
            "compute": self._stragglers.compute.state(),
            "conn_ref": self._throughputs.state(),
            "slow_keys": self._slowdowns.state(),
            "back": self._nodes.back_ns,
            "agents": self._nodes.agents_ns,
            "run": self.run,
        }

    def _placement_dump(self) -> list[dict[str, Any]]:
        version = self._groups.placement_version
        if self._placement_state is None or self._placement_state[0] != version:
            places = self.placement.values()
            self._placement_state = (version, [place.model_dump(mode="json") for place in places])
        return self._placement_state[1]

    def restore(self, state: dict[str, Any]) -> None:
        """Take the state of a snapshot (this detector was just created for the job)."""
        groups = self._groups
        places = (RankPlace.model_validate(place) for place in state["placement"])
        groups.placement = {place.rank: place for place in places}
        groups.comms = {
            comm: CommTracker.restored(self.job, comm, self.params, tracker)
            for comm, tracker in state["comms"].items()
        }
        self._throughputs.clear()
        self._slowdowns.clear()
        groups.placement_version += 1
        self.book.restore(state["findings"])
        if "compute" in state:
            self._stragglers.restore(state["compute"])
        self._throughputs.restore(state.get("conn_ref", {}))
        self._slowdowns.restore(state["slow_keys"])
        back = {str(node): int(at) for node, at in state.get("back", {}).items()}
        agents = {str(node): int(at) for node, at in state.get("agents", {}).items()}
        run = state.get("run")
        self.run = int(run) if run is not None else None
        self._nodes.restore(back, groups.latest_seen_ns(), agents)

    def close(self, now_ns: int) -> list[Diagnosis]:
        """Resolve every open finding (the job stopped)."""
        return self.book.resolve_all(now_ns)
