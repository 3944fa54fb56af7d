"""The engine: routes decoded v1 messages to the detectors and runs their event-time clock.

The same object serves the offline replay (`c4 diagnose`) and, fed from Kafka, the Faust
app: neither path has logic of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol

from schemas.base import C4Model
from schemas.codec import decode_object
from schemas.files import Topology
from schemas.messages import (
    Collective,
    Collectives,
    Diagnosis,
    Gpu,
    Gpus,
    Job,
    Link,
    Links,
    Member,
    Neighbours,
    Route,
)
from streams.core.alignment import LinkAlignment
from streams.core.cabling import CablingCheck
from streams.core.clock import TickClock
from streams.core.comm import NOT_YET
from streams.core.fabric import FabricCorrelator
from streams.core.findings import FindingBook, OpenFinding
from streams.core.hardware import HardwareMonitor, empty_node_state
from streams.core.job import JobDetector
from streams.core.membership import MembershipBook
from streams.core.params import DetectorParams
from streams.core.places import PlacementIndex, PortHealth, Routes, port_id
from streams.core.rows import ConnRow, OpsRow, SeenRow
from streams.core.shard import SeqPart
from streams.core.slowpath import SlowPath
from streams.core.split import JobShare
from streams.core.stage import JOB, NODE, KeyState, StateKey, finding_key, state_key


class RouteBook:
    """The planned spine of each flow, from the ``c4.route.v1`` plans, and when it moved."""

    def __init__(self) -> None:
        self._via: dict[str, str | None] = {}
        self._moved: dict[str, int] = {}
        self._moves = 0

    def update(self, route: Route, now_ns: int) -> None:
        """Record every path of one node's plan (learnt at event time ``now_ns``)."""
        for path in route.paths:
            if path.flow in self._via and self._via[path.flow] != path.via:
                self._moved[path.flow] = now_ns
                self._moves += 1
            self._via[path.flow] = path.via

    def via(self, flow: str) -> str | None:
        """The spine of a flow, None when unplanned."""
        return self._via.get(flow)

    def moved_at(self, flow: str) -> int | None:
        """When a plan last moved the flow (event time), None if never."""
        return self._moved.get(flow)

    def generation(self) -> int:
        """How many moves were recorded."""
        return self._moves


# The messages that carry measurements (and so event time); job and route are facts.
DATA_KINDS = (Collective, Link, Gpu)
# Flows whose shared move a worker keeps at most (`_SharedRoutes`): those of its jobs' checks.
MOVES_KEPT = 1 << 20
MEMBERSHIP_KEY = "membership"  # a job's member reports, in its snapshot
CABLING_KEY = "cabling"  # a node's ports found on another leaf, in its snapshot
WAITING_KEY = "waiting"  # a job's collective reports held back for link reports (live)
BARRIER_KEY = "barrier"  # the latest barrier of the stages on Kafka a job's state holds


class SharedFacts(Protocol):
    """Facts that other partitions learn (scaled out: other workers), read where needed.

    One engine sees every message of a replay; a live worker sees only its partitions, so
    placements (keyed by job), port health (keyed by node) and planned routes reach it
    through this interface as well as from its own messages.
    """

    def job_of_port(self, port: str) -> str | None:
        """The job using a NIC port (global id)."""
        ...

    def job_of_gpu(self, gpu: str) -> str | None:
        """The job running on a GPU (``node/gpuN``)."""
        ...

    def port_health(self, port: str) -> tuple[bool, bool]:
        """(down, degraded) of a NIC port, as its node's monitor last said."""
        ...

    def via(self, flow: str) -> str | None:
        """The planned spine of a flow."""
        ...

    def moved_at(self, flow: str) -> int | None:
        """When a plan last moved the flow (event time of the worker that learnt it)."""
        ...

    def routes_token(self) -> int:
        """Changes whenever some flow's ``moved_at`` changes, whichever worker learnt it."""
        ...

    def health_token(self) -> int:
        """Changes whenever some port's ``port_health`` changes, whichever worker learnt it."""
        ...


class InputProgress(Protocol):
    """Live: which inputs may still hold records older than what was processed already.

    A replay reads every record in event-time order and needs none of this. A live worker
    reads its partitions in whatever order the broker hands them out: after an outage or at
    start-up, a whole topic's backlog can come before another's. A conclusion that joins a
    job's reports with facts or hardware reports from another topic waits while those may
    still be behind, so that it is the one the replay draws (streams.live.InputLag).
    """

    def placements_pending(self) -> bool:
        """Placements (the job topic) may still come that are older than the data seen."""
        ...

    def hardware_behind(self) -> bool:
        """Some node's link reports may still come (``hardware_pending`` of any node)."""
        ...

    def hardware_pending(self, node: str) -> bool:
        """A node's link reports may still come that are older than the data seen."""
        ...


class _SharedPortHealth:
    """Port health from this engine's own monitor, else from the shared facts."""

    def __init__(self, local: HardwareMonitor, shared: SharedFacts) -> None:
        self._local, self._shared = local, shared

    def is_down(self, port: str) -> bool:
        return self._local.is_down(port) or self._shared.port_health(port)[0]

    def errors_rising(self, port: str) -> bool:
        return self._local.errors_rising(port) or self._shared.port_health(port)[1]

    def health_version(self) -> int:
        # Other workers' port reports reach the shared facts with a fresh token.
        return hash((self._local.health_version(), self._shared.health_token()))


class _SharedRoutes:
    def __init__(self, local: RouteBook, shared: SharedFacts, kept: int = MOVES_KEPT) -> None:
        self._local, self._shared = local, shared
        self._kept = kept
        # The shared facts' ``moved_at`` of each flow asked, as of the routes token read
        # last: a check asks it of every connection of the job, and each answer was a read
        # of the shared table. Any move rewrites the token (`SharedFacts.routes_token`).
        self._moved: dict[str, int | None] = {}
        self._moved_token: int | None = None

    def refresh(self) -> None:
        """Before a check: the cached moves hold only while the routes token is the same."""
        token = self._shared.routes_token()
        if token != self._moved_token:
            self._moved_token = token
            self._moved.clear()

    def via(self, flow: str) -> str | None:
        return self._local.via(flow) or self._shared.via(flow)

    def moved_at(self, flow: str) -> int | None:
        local = self._local.moved_at(flow)
        moved = self._moved
        if flow in moved:
            shared = moved[flow]
        else:
            if len(moved) >= self._kept:  # flows of jobs long gone: asked again when needed
                moved.clear()
            shared = moved[flow] = self._shared.moved_at(flow)
        return max(local or 0, shared or 0) or None

    def generation(self) -> int:
        # Other workers' moves reach the shared facts with a fresh token.
        return hash((self._local.generation(), self._shared.routes_token()))


class Engine:
    """Every detector of a cluster, fed in event time: the job stage (`DetectionStage`),
    keyed by job and by node.

    ``shared`` supplies what other partitions learnt (live, scaled out). With
    ``local_fabric`` False the fabric correlator runs elsewhere: the engine only collects
    each job's slow paths when they change (``drain_slow_paths``). ``progress`` (live only)
    says which inputs may still be behind: a job's collective reports wait while its nodes'
    link reports trail them (``streams.core.alignment``), a job with a hang whose suspects
    depend on its ports' link reports is not judged while those reports may still come
    (``held``), and a hardware finding on a part of no known job waits while placements
    may still come.
    """

    def __init__(
        self,
        params: DetectorParams | None = None,
        job_params: Mapping[str, Mapping[str, Any]] | None = None,
        topology: Topology | None = None,
        *,
        shared: SharedFacts | None = None,
        local_fabric: bool = True,
        progress: InputProgress | None = None,
    ) -> None:
        self.params = params or DetectorParams()
        self._job_params = {
            job: self.params.with_overrides(dict(o)) for job, o in (job_params or {}).items()
        }
        self.placements = PlacementIndex()
        self.routes = RouteBook()
        job_of_port, job_of_gpu = self.placements.job_of_port, self.placements.job_of_gpu
        if shared is not None:
            facts = shared

            def job_of_port(port: str) -> str | None:
                return self.placements.job_of_port(port) or facts.job_of_port(port)

            def job_of_gpu(gpu: str) -> str | None:
                return self.placements.job_of_gpu(gpu) or facts.job_of_gpu(gpu)

        self.progress = progress
        self.hardware = HardwareMonitor(
            self.params,
            job_of_port,
            job_of_gpu,
            placements_pending=progress.placements_pending if progress else lambda: False,
        )
        self._port_health: PortHealth = (
            self.hardware if shared is None else _SharedPortHealth(self.hardware, shared)
        )
        self._routes: Routes = self.routes if shared is None else _SharedRoutes(self.routes, shared)
        self.fabric = FabricCorrelator(topology, self.params)
        self.cabling = CablingCheck(topology)  # ports LLDP finds on another leaf
        # Which leaf each NIC port hangs off: a job tells a slow fabric link from a slow port.
        self._leaf_of: dict[str, str] = {
            f"{node.id}/{port.id}": port.leaf
            for node in (topology.nodes if topology is not None else ())
            for port in node.ports
        }
        self.local_fabric = local_fabric
        self.jobs: dict[str, JobDetector] = {}
        # Placements assembled from the ranks' own reports, and the ones not handed out yet.
        self.membership = MembershipBook()
        self._assembled: list[Job] = []
        self.clock = TickClock(self.params.tick_ns)
        self.counts: dict[str, int] = {}
        self._reported_paths: dict[str, list[SlowPath]] = {}
        self._changed_paths: dict[str, list[SlowPath]] = {}
        # job -> the latest barrier of the stages on Kafka applied (`applied_barrier`)
        self._barriers: dict[str, int] = {}
        # Jobs whose last check was held back for their ports' link reports (live only).
        self.held: set[str] = set()
        self._held_check_ns = 0
        self.alignment = LinkAlignment(
            progress, self.hardware.node_reported_at, self.params.silent_after_ns
        )
        # Per job: the run its restart last ended into, and the findings book of the run
        # before (a hang seen again in that run's last reports keeps its id); reports of an
        # earlier run read as that run's and left out.
        self._ended_runs: dict[str, int] = {}
        self._closed_books: dict[str, FindingBook] = {}

    @property
    def now_ns(self) -> int:
        """The event-time clock: the latest time seen (never goes back)."""
        return self.clock.now_ns

    def _job(self, job: str) -> JobDetector:
        detector = self.jobs.get(job)
        if detector is None:
            params = self._job_params.get(job, self.params)
            detector = JobDetector(
                job,
                params,
                self._port_health,
                self._routes,
                fabric_known=self.fabric.knows_paths,
                leaf_of=self._leaf_of,
            )
            before = self._closed_books.pop(job, None)
            if before is not None:
                detector.book.inherit(before)
            self.jobs[job] = detector
        return detector

    def process(self, message: C4Model) -> list[Diagnosis]:
        """Feed one message; returns the diagnoses that changed (firing or resolved)."""
        if isinstance(message, Collectives):  # a batch: its messages, in order
            found = [found for each in message.messages for found in self.process(each)]
            if message.node is not None:
                self._agent_present(message.job, message.node, message.ts_ns)
            return found
        if isinstance(message, Links | Gpus):  # a node's batch: its messages, in order
            return [found for each in message.messages for found in self.process(each)]
        kind = type(message).__name__
        self.counts[kind] = self.counts.get(kind, 0) + 1
        out: list[Diagnosis] = []
        if isinstance(message, Collective):
            if self.alignment.holds(message):
                return out  # it moves the clock when it is processed, in the order it came
            out.extend(self._on_collective(message))
        elif isinstance(message, Link):
            out.extend(self.hardware.on_link(message))
            waiting = self.held or self.alignment.waiting
            if waiting and message.ts_ns >= self._held_check_ns:
                # The link reports a held job (or held reports) wait for may be these: look
                # again, once a tick of their time.
                self._held_check_ns = message.ts_ns + self.params.tick_ns
                out.extend(self._look_again())
        elif isinstance(message, Gpu):
            out.extend(self.hardware.on_gpu(message))
        elif isinstance(message, Neighbours):
            out.extend(self.cabling.on_neighbours(message))
        elif isinstance(message, Job):
            # The job's held reports come before a fact about it (a stop, a new placement).
            out.extend(self._release(message.job))
            self.placements.update(message)
            if message.state == "stopped":
                stopped = self.jobs.pop(message.job, None)
                self.held.discard(message.job)
                self._forget_runs(message.job)
                if stopped is not None:
                    out.extend(stopped.close(message.ts_ns))
                out.extend(self.membership.close(message.job, message.ts_ns))
            else:
                self._job(message.job).on_job(message)
        elif isinstance(message, Member):
            out.extend(self._release(message.job))
            before = self.membership.restart_of(message.job)
            caused_by = self.membership.ingest(message)
            after = self.membership.restart_of(message.job)
            if before is not None and after is not None and after > before:
                out.extend(self._end_run(message.job, after, message.ts_ns))
            for caused in caused_by:
                if isinstance(caused, Job):
                    self._assembled.append(caused)
                    out.extend(self.process(caused))
                elif isinstance(caused, Diagnosis):
                    out.append(caused)
        elif isinstance(message, Route):
            # Learnt as of the latest report seen, held ones too: a plan's settling time
            # runs from when it came among the reports, however long they wait.
            self.routes.update(message, max(self.clock.now_ns, self.alignment.latest_ns))
        if isinstance(message, DATA_KINDS):
            # Only measurements move event time: placements and route plans come from
            # launchers and action workers stamped on their own clocks.
            out.extend(self.advance(message.ts_ns))
        return out

    def _end_run(self, job: str, run: int, ts_ns: int) -> list[Diagnosis]:
        """The job restarted (a requeue, its pods replaced) into run ``run``: what its
        detectors learnt of the run before (pending operations, compute baselines, the
        placement) is no evidence about the new one, on nodes that may have changed. Its
        findings close; what they were is kept, so the same fault seen again in that run's
        last reports is the same finding, not a new one."""
        detector = self.jobs.get(job)
        if detector is not None and detector.run is not None and detector.run >= run:
            return []  # its reports told of the new run first: this detector is of it
        self.jobs.pop(job, None)
        self.held.discard(job)
        self.placements.forget(job)
        self._ended_runs[job] = run
        if detector is None:
            return []
        closed = detector.close(ts_ns)
        self._closed_books[job] = detector.book
        return closed

    def _earlier_run(self, message: Collective) -> bool:
        """Whether the report is of a run the job has left: a lower ``restart`` than the
        job's current run, or (without one) stamped before that run's first member report."""
        job = message.job
        if message.restart is not None:
            detector = self.jobs.get(job)
            member_run = self.membership.restart_of(job)
            known = max(
                self._ended_runs.get(job, -1),
                -1 if member_run is None else member_run,
                -1 if detector is None or detector.run is None else detector.run,
            )
            if message.restart < known:
                return True
        replaced = self.membership.replaced_before_ns(job)
        return replaced is not None and message.ts_ns < replaced and message.restart is None

    def on_shares(self, shares: list[JobShare]) -> list[Diagnosis]:
        """Take what the node stages handed on at a barrier (`streams.core.split`), per
        job: the run its reports are of, their times (liveness), each member's latest
        report and place, the connection samples, each report's operations, then its
        groups' operation parts and open operations. The order is the same however many
        node stages there were."""
        out: list[Diagnosis] = []
        by_job: dict[str, list[JobShare]] = {}
        for share in shares:
            by_job.setdefault(share.job, []).append(share)
        for job in sorted(by_job):
            its = by_job[job]
            times = sorted(ts for share in its for ts in share.times)
            self.counts["Collective"] = self.counts.get("Collective", 0) + len(times)
            runs = [share.run for share in its if share.run is not None]
            if runs:
                run = max(runs)
                current = self.jobs.get(job)
                if current is not None and current.run is not None and run > current.run:
                    out.extend(self._end_run(job, run, times[0] if times else self.now_ns))
            detector = self._job(job)
            if runs and (detector.run is None or max(runs) > detector.run):
                detector.run = max(runs)
            detector.on_report_times(times)
            # The groups met at this barrier, made in the input's order (as one detector
            # makes them, report by report): hangs and slowdowns go through them in it.
            for _, comm, size in sorted(met for share in its for met in share.met):
                if comm not in detector.comms:
                    detector.tracker_of(comm, size)
            for seen in sorted((row for share in its for row in share.seen), key=_seen_order):
                detector.on_seen(seen)
            for row in sorted((row for share in its for row in share.conns), key=_conn_order):
                detector.on_conns(row)
            for node, ts_ns in sorted(agent for share in its for agent in share.agents):
                self._agent_present(job, node, ts_ns)
            for ops in sorted((row for share in its for row in share.spans), key=_ops_order):
                detector.on_ops(ops)
            for part in sorted((part for share in its for part in share.parts), key=_part_order):
                detector.on_part(part)
            opens: dict[str, list[SeqPart]] = {}
            finished: dict[str, int] = {}
            for share in its:
                for comm, latest in share.finished:
                    finished[comm] = max(latest, finished.get(comm, NOT_YET))
                for part in share.opens:
                    opens.setdefault(part.comm, []).append(part)
            for comm in sorted(set(opens) | set(finished) | detector.merging_comms()):
                detector.on_open(comm, opens.get(comm, []), finished.get(comm, NOT_YET))
            out.extend(self._lagging_checks(job, detector, times))
        return out

    def _lagging_checks(self, job: str, detector: JobDetector, times: list[int]) -> list[Diagnosis]:
        """A job whose reports lag far behind the clock is checked on its own data time
        (`_on_collective`), here once its barrier's reports are all in."""
        out: list[Diagnosis] = []
        for ts_ns in times:
            lagging = ts_ns + self.params.silent_after_ns < self.now_ns
            if lagging and ts_ns >= detector.next_check_ns:
                detector.next_check_ns = ts_ns + self.params.tick_ns
                out.extend(self._check_job(job, detector, ts_ns))
        return out

    def _on_collective(self, message: Collective) -> list[Diagnosis]:
        out: list[Diagnosis] = []
        if self._earlier_run(message):
            # Reported by a run the job's restart replaced (in flight at the requeue): its
            # unfinished operations are no hang of the new run, its findings closed with it.
            return out
        run = message.restart
        if run is not None:
            current = self.jobs.get(message.job)
            if current is not None and current.run is not None and run > current.run:
                # The new run's reports came before its ranks' member reports did.
                out.extend(self._end_run(message.job, run, message.ts_ns))
        detector = self._job(message.job)
        if run is not None and (detector.run is None or run > detector.run):
            detector.run = run
        detector.on_collective(message)
        # A job whose reports lag far behind the clock (live: its partition catching up
        # a backlog, or its reports held for link reports) gets no global tick while it
        # catches up: it is checked on its own data time instead, so no slowdown or
        # straggler slides by unobserved; at that time, not ``silent_after`` past it (as
        # a silent job is): its next reports are at hand, and a node that went down in
        # them is silent for as long as its hang is old, as a replay sees it.
        lagging = message.ts_ns + self.params.silent_after_ns < self.now_ns
        if lagging and message.ts_ns >= detector.next_check_ns:
            detector.next_check_ns = message.ts_ns + self.params.tick_ns
            out.extend(self._check_job(message.job, detector, message.ts_ns))
        return out

    def _release_ready(self) -> list[Diagnosis]:
        """Process the held collective reports whose nodes' link reports caught up."""
        return self._process_held(self.alignment.ready())

    def _release(self, job: str) -> list[Diagnosis]:
        """Process every collective report the job holds back, now."""
        return self._process_held(self.alignment.release(job))

    def _process_held(self, messages: Iterable[Collective]) -> list[Diagnosis]:
        out: list[Diagnosis] = []
        for message in messages:
            out.extend(self._on_collective(message))
            out.extend(self.advance(message.ts_ns))
        return out

    def _agent_present(self, job: str, node: str, ts_ns: int) -> None:
        """A node's agent packed (or had nothing to pack of) the job's reports at ``ts_ns``:
        the node is up, whatever its ranks said."""
        detector = self.jobs.get(job)
        replaced = self.membership.replaced_before_ns(job)
        if detector is not None and (replaced is None or ts_ns >= replaced):
            detector.on_agent(node, ts_ns)

    def on_barrier(self, shares: list[JobShare], latest_ns: int) -> list[Diagnosis]:
        """The job stage's side of a barrier: what the node stages handed on, then the
        clock moved to the latest event time of it (`NOT_YET`: not moved)."""
        found = self.on_shares(shares) if shares else []
        if latest_ns != NOT_YET:
            found.extend(self.advance(latest_ns))
        return found

    def applied_barrier(self, job: str, number: int | None = None) -> int | None:
        """The latest barrier of the stages on Kafka whose shares a job's state holds
        (None: none), after noting ``number`` as applied (where given): kept in the job's
        snapshot, so that a restored job stage drops the shares it took before."""
        if number is not None:
            self._barriers[job] = number
        return self._barriers.get(job)

    def advance(self, now_ns: int) -> list[Diagnosis]:
        """Move the event-time clock forward (never back); run the timers when due."""
        if not self.clock.advance(now_ns):
            return []
        return self.check(now_ns)

    def check(self, now_ns: int) -> list[Diagnosis]:
        """Evaluate every detector at ``now_ns``."""
        self._refresh_routes()
        out: list[Diagnosis] = []
        slow_paths = []
        for job, detector in self.jobs.items():
            out.extend(self._check_job(job, detector, now_ns))
            slow_paths.extend(detector.slow_paths)
        out.extend(self.hardware.check(now_ns))
        out.extend(self.membership.check(now_ns))
        if self.local_fabric:
            # The jobs' other paths: read only when the correlator has a tie to break.
            seen = (path for detector in self.jobs.values() for path in detector.fabric_seen)
            out.extend(self.fabric.check(now_ns, slow_paths, seen))
        return out

    def recheck(self) -> list[Diagnosis]:
        """Judge again what waited for other inputs (held reports and jobs, hardware of no
        known job); live, on every tick, after which inputs are behind was measured."""
        self.alignment.refresh()
        return self._look_again()

    def _look_again(self) -> list[Diagnosis]:
        out = self._release_ready()
        out.extend(self.hardware.release_deferred(self.now_ns))
        for job in sorted(self.held):
            detector = self.jobs.get(job)
            if detector is None:
                self.held.discard(job)
            else:
                out.extend(self._check_job(job, detector, self.now_ns))
        return out

    def _awaits_hardware(self, detector: JobDetector, now_ns: int) -> bool:
        """A hang is due whose suspects come from link reports that may still be behind.

        Which port of a stalled communicator is down is read from the hardware monitor: it
        must have the link reports up to the time the hang is due, as a replay has them.
        Only while those reports may still come (``progress``); a node that stopped
        reporting in the job's data is not waited for (it is down, its agent too).
        """
        progress = self.progress
        if progress is None or not progress.hardware_behind():
            return False
        silent = detector.params.silent_after_ns
        data_now = detector.data_now_ns()
        if data_now < 0:
            return False
        now_ns = min(now_ns, data_now + silent)
        for tracker in detector.comms.values():
            hang = tracker.hang(now_ns)
            if hang is None or hang.kind != "comm":
                continue
            due = hang.since_ns + detector.params.hang_after_ns(tracker.median_op_ns())
            for member in tracker.members:
                node, port = member.node, member.port
                rank = member.global_rank
                if rank is not None and (place := detector.placement.get(rank)) is not None:
                    node, port = node or place.node, port or place.port
                if node is None or port is None or member.last_seen_ns < data_now - silent:
                    continue
                if not progress.hardware_pending(node):
                    continue
                reported = self.hardware.reported_at(port_id(node, port))
                if reported is None or reported < due:
                    return True
        return False

    def _check_job(self, job: str, detector: JobDetector, now_ns: int) -> list[Diagnosis]:
        if job in self.alignment.waiting:
            # Reports of it wait for link reports: judged up to the time of those it
            # processed, never ``silent_after`` past them as if it were silent (a node that
            # went down would not be silent yet for as long as its hang is old).
            now_ns = min(now_ns, detector.data_now_ns())
        if self._awaits_hardware(detector, now_ns):
            self.held.add(job)
            return []
        self.held.discard(job)
        self._refresh_routes()
        found = detector.check(now_ns)
        if not self.local_fabric and detector.slow_paths != self._reported_paths.get(job, []):
            self._reported_paths[job] = list(detector.slow_paths)
            self._changed_paths[job] = list(detector.slow_paths)
        return found

    def _refresh_routes(self) -> None:
        """What other workers moved is read anew before a check (`_SharedRoutes`)."""
        if isinstance(self._routes, _SharedRoutes):
            self._routes.refresh()

    def drain_placements(self) -> list[Job]:
        """The placements assembled from member reports since the last call (live: to be
        published on the job topic, where the action workers and other workers read them)."""
        assembled, self._assembled = self._assembled, []
        return assembled

    def drain_slow_paths(self) -> dict[str, list[SlowPath]]:
        """Each job's slow paths that changed since the last call (for a remote correlator)."""
        changed, self._changed_paths = self._changed_paths, {}
        return changed

    def open_findings(self) -> list[OpenFinding]:
        """Every finding firing here now: its jobs', its worlds', its nodes' (and the
        fabric's when it correlates here); live, only those of the partitions it holds."""
        found = [f for detector in self.jobs.values() for f in detector.book.open_findings()]
        found += self.membership.open_findings()
        found += self.hardware.book.open_findings()
        found += self.cabling.book.open_findings()
        if self.local_fabric:
            found += self.fabric.book.open_findings()
        return found

    # --- the DetectionStage interface (streams.core.stage) -----------------------------
    def key_of(self, message: C4Model) -> StateKey | None:
        """The job or node whose state a message changes."""
        return state_key(message)

    def key_of_finding(self, diagnosis: Diagnosis) -> StateKey | None:
        """The job or node whose state holds a finding."""
        return finding_key(diagnosis)

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """Feed one message (`process`)."""
        return self.process(message)

    def on_timer(self, now_ns: int) -> list[Diagnosis]:
        """Judge again what waited for other inputs (`recheck`), then move the clock to
        ``now_ns`` (`advance`: not back)."""
        found = self.recheck()
        found.extend(self.advance(now_ns))
        return found

    def on_progress(self) -> None:
        """Which inputs are behind was measured again: the held reports are asked anew."""
        self.alignment.refresh()

    def on_eof(self) -> list[Diagnosis]:
        """The input ended: every detector judged at the clock's time."""
        return self.check(self.now_ns)

    def keys(self, kind: str) -> list[StateKey]:
        """The jobs (also one whose every report waits for link reports, with no detector
        yet) or the nodes whose state is held here."""
        if kind == JOB:
            ids = list(dict.fromkeys((*self.jobs, *self.alignment.waiting)))
        else:
            ids = sorted(self.hardware.nodes() | self.cabling.nodes())
        return [StateKey(kind, each) for each in ids]

    def snapshot(self, keys: Collection[StateKey]) -> dict[StateKey, KeyState]:
        """Each job's or node's state as plain data (the nodes read in one pass)."""
        out: dict[StateKey, KeyState] = {}
        nodes = {key.id for key in keys if key.kind == NODE}
        node_states = self.node_states(nodes) if nodes else {}
        for key in keys:
            state = self.job_state(key.id) if key.kind == JOB else node_states.get(key.id)
            if state is not None:
                out[key] = state
        return out

    def restore(self, key: StateKey, state: KeyState) -> None:
        """Take a job or node over from its snapshot."""
        if key.kind == JOB:
            self.restore_job(key.id, state)
        else:
            self.restore_node(state)

    def drop(self, key: StateKey) -> None:
        """Forget a job or node (another worker holds it now, or it is relearnt)."""
        if key.kind == JOB:
            self.drop_job(key.id)
        else:
            self.drop_node(key.id)

    def port_state(self, port: str) -> tuple[bool, bool]:
        """(down, degraded) of a NIC port as this engine's own monitor says (the port's
        node reports here): what it tells other workers through the shared facts."""
        return self.hardware.is_down(port), self.hardware.errors_rising(port)

    # --- snapshots (a restarted or rebalanced worker goes on from them) ------------------
    def job_state(self, job: str) -> dict[str, Any] | None:
        """One job's detector state as plain data; None for a job not tracked here."""
        detector = self.jobs.get(job)
        world = self.membership.job_state(job)
        waiting = self.alignment.held_dumps(job, _held_dump)
        if detector is None and world is None and not waiting:
            return None
        state = {} if detector is None else detector.state()
        if waiting:
            state[WAITING_KEY] = waiting
        barrier = self._barriers.get(job)
        if barrier is not None:
            state[BARRIER_KEY] = barrier
        return state if world is None else state | {MEMBERSHIP_KEY: world}

    def restore_job(self, job: str, state: dict[str, Any]) -> None:
        """Take over a job from a snapshot (its findings were published before it was taken)."""
        waiting = [decode_object(each, "collective") for each in state.get(WAITING_KEY, ())]
        self.alignment.hold(job, [each for each in waiting if isinstance(each, Collective)])
        world = state.get(MEMBERSHIP_KEY)
        if world is not None:
            self.membership.restore_job(job, world)
        barrier = state.get(BARRIER_KEY)
        if type(barrier) is int:
            self._barriers[job] = barrier
        own = (MEMBERSHIP_KEY, WAITING_KEY, BARRIER_KEY)
        state = {k: v for k, v in state.items() if k not in own}
        if not state:
            return  # its ranks reported, none of its collectives was processed yet
        detector = self._job(job)
        detector.restore(state)
        if detector.placement:
            ranks = tuple(detector.placement.values())
            self.placements.update(
                Job(v=1, kind="job", job=job, ts_ns=0, state="running", ranks=ranks, comms={})
            )

    def drop_job(self, job: str) -> None:
        """Forget a job whose partition moved to another worker."""
        self.jobs.pop(job, None)
        self.held.discard(job)
        self.alignment.release(job)  # its snapshot holds them: the next owner goes on
        self.membership.drop(job)
        self.placements.forget(job)
        self._reported_paths.pop(job, None)
        self._changed_paths.pop(job, None)
        self._barriers.pop(job, None)
        self._forget_runs(job)

    def _forget_runs(self, job: str) -> None:
        """The job is over here: which run it was in, and its earlier run's hangs, too."""
        self._ended_runs.pop(job, None)
        self._closed_books.pop(job, None)

    def node_states(self, nodes: set[str]) -> dict[str, dict[str, Any]]:
        """The hardware and cabling state of each of these nodes held here, as plain data."""
        states = self.hardware.node_states(nodes)
        for node in nodes & self.cabling.nodes():
            cabling = self.cabling.node_state(node)
            if cabling is not None:
                states.setdefault(node, empty_node_state())[CABLING_KEY] = cabling
        return states

    def restore_node(self, state: dict[str, Any]) -> None:
        """Take over a node's hardware and cabling state from a snapshot."""
        cabling = state.get(CABLING_KEY)
        if cabling is not None:
            self.cabling.restore_node(cabling)
        self.hardware.restore_node(state)

    def drop_node(self, node: str) -> None:
        """Forget a node whose partition moved to another worker."""
        self.hardware.drop_node(node)
        self.cabling.drop_node(node)


def _held_dump(message: Collective) -> dict[str, Any]:
    """A held report as plain data for its job's snapshot. Python mode: tuples as they are
    (orjson writes them as arrays), 4x faster than the JSON mode."""
    return message.model_dump(by_alias=True)


def _seen_order(row: SeenRow) -> tuple[str, int]:
    return (row[0], row[2])


def _conn_order(row: ConnRow) -> tuple[int, str, int]:
    """Connection samples of a barrier in event time, then group and rank: the same order
    whichever node stage handed them on."""
    return (row[3], row[0], row[2])


def _part_order(part: SeqPart) -> tuple[str, int, int]:
    return (part.comm, part.seq, part.members[0] if part.members else -1)


def _ops_order(row: OpsRow) -> tuple[int, int, str]:
    """Reports' operations of a barrier in event time, then rank and group."""
    return (row[2], row[0], row[1])
