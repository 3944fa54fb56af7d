"""What the injected faults do to one job's timing, in event-time nanoseconds.

A fault changes one of four things: a rank's compute speed (slow_gpu), whether a rank still
enters operations (gpu_stop, process_stuck, node_down), whether a communicator's operations can
finish at all (link_down, node_down), and the bandwidth of ring connections (port_degraded,
fabric_link_degraded, fabric_link_down). Hardware counters and telemetry are the agents'
business, not this one's.

A leaf~spine link that goes dark (fabric_link_down) does not stop the connections crossing it:
the leaves keep hashing some of their packets onto it until their routing converges, and RDMA
recovers those with go-back-N retransmissions after timeouts. The connections crawl at
``DOWN_SHARE`` of their speed until the job is rerouted.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

from simulator.cluster import GPUS_PER_NODE, Cluster, Comm, Conn, PlacedJob
from simulator.scenario import (
    FabricLinkDegraded,
    FabricLinkDown,
    GpuStop,
    LinkDown,
    NodeDown,
    PortDegraded,
    ProcessStuck,
    Scenario,
    SlowGpu,
)

NS_PER_S = 1_000_000_000
DOWN_SHARE = 0.2  # what a connection over a dark fabric link still gets of its speed


def at_ns(scenario: Scenario, seconds: float) -> int:
    """Event time of a scenario offset in seconds."""
    return scenario.start_ns + round(seconds * NS_PER_S)


@dataclass(frozen=True, slots=True)
class Window:
    """A factor in force from ``start_ns`` until ``end_ns`` (None: to the end of the run)."""

    start_ns: int
    end_ns: int | None
    factor: float

    def active(self, t_ns: int) -> bool:
        """Whether the factor applies at ``t_ns``."""
        return self.start_ns <= t_ns and (self.end_ns is None or t_ns < self.end_ns)


@dataclass(frozen=True, slots=True)
class Breakage:
    """From ``since_ns`` no operation of the communicator can finish."""

    since_ns: int
    dead: frozenset[int]  # ring connections with data stuck in flight (the rest just wait)


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """A ring's connection speeds (Gbit/s) in each epoch between bandwidth changes."""

    starts: tuple[int, ...]
    conn_gbps: tuple[tuple[float, ...], ...]
    slowest: tuple[float, ...]

    def epoch(self, t_ns: int) -> int:
        """The index of the epoch in force at ``t_ns``."""
        return max(0, bisect_right(self.starts, t_ns) - 1)


@dataclass(frozen=True, slots=True)
class JobEffects:
    """Every fault effect on one job."""

    slow: Mapping[int, tuple[Window, ...]]  # global rank -> compute slowdowns
    stop_ns: Mapping[int, int]  # global rank -> from when it enters no operation
    broken: Mapping[str, Breakage]  # comm id -> when its operations stop finishing
    bandwidth: Mapping[str, Bandwidth]  # ring comm id -> connection speeds over time
    # all-to-all comm id -> its pairs' speeds over time (`Comm.pairs`; none without)
    pair_bandwidth: Mapping[str, Bandwidth]

    def slow_factor(self, rank: int, t_ns: int) -> float:
        """How much longer the rank's compute starting at ``t_ns`` takes."""
        factor = 1.0
        for window in self.slow.get(rank, ()):
            if window.active(t_ns):
                factor *= window.factor
        return factor


def job_effects(cluster: Cluster, scenario: Scenario, job: PlacedJob) -> JobEffects:
    """Translate the scenario's faults into their effect on one job."""
    slow: dict[int, list[Window]] = {}
    stop: dict[int, int] = {}
    broken: dict[str, Breakage] = {}
    port_windows: dict[str, list[Window]] = {}
    link_windows: dict[str, list[Window]] = {}
    for fault in scenario.faults:
        onset = at_ns(scenario, fault.at_s)
        if isinstance(fault, SlowGpu) and fault.job == job.spec.id:
            until = None if fault.until_s is None else at_ns(scenario, fault.until_s)
            slow.setdefault(fault.rank, []).append(Window(onset, until, fault.factor))
        elif isinstance(fault, GpuStop | ProcessStuck) and fault.job == job.spec.id:
            stop[fault.rank] = min(stop.get(fault.rank, onset), onset)
        elif isinstance(fault, NodeDown) and fault.node in job.nodes:
            first = job.nodes.index(fault.node) * GPUS_PER_NODE
            gone = set(range(first, min(first + GPUS_PER_NODE, job.spec.ranks)))
            for rank in gone:
                stop[rank] = min(stop.get(rank, onset), onset)
            for comm in job.comms:
                _break(broken, comm, onset, _conns_touching_ranks(comm, gone))
        elif isinstance(fault, LinkDown):
            port = f"{fault.node}/{fault.port}"
            for comm in job.comms:
                dead = _conns_touching_port(comm, port)
                # An all-to-all's pairs may cross a port its ring hops do not.
                paired = any(port in (c.src_port, c.dst_port) for c in comm.pairs or ())
                if dead or paired:
                    _break(broken, comm, onset, dead)
        elif isinstance(fault, PortDegraded | FabricLinkDegraded):
            until = None if fault.until_s is None else at_ns(scenario, fault.until_s)
            window = Window(onset, until, fault.factor)
            if isinstance(fault, PortDegraded):
                port_windows.setdefault(f"{fault.node}/{fault.port}", []).append(window)
            else:
                link_windows.setdefault(fault.link, []).append(window)
        elif isinstance(fault, FabricLinkDown):
            window = Window(onset, None, DOWN_SHARE)
            link_windows.setdefault(fault.link, []).append(window)
    moves = _path_moves(cluster, scenario, job)
    windows = (scenario.start_ns, port_windows, link_windows, moves)
    bandwidth = {
        comm.id: _bandwidth(comm.id, comm.ring, *windows)
        for comm in job.comms
        if comm.ring is not None
    }
    pairs = {
        comm.id: _bandwidth(comm.id, comm.pairs, *windows)
        for comm in job.comms
        if comm.pairs is not None
    }
    return JobEffects(
        {rank: tuple(windows) for rank, windows in slow.items()}, stop, broken, bandwidth, pairs
    )


def _break(broken: dict[str, Breakage], comm: Comm, onset: int, dead: frozenset[int]) -> None:
    known = broken.get(comm.id)
    if known is None or onset < known.since_ns:
        broken[comm.id] = Breakage(onset, dead)


def _conns_touching_ranks(comm: Comm, ranks: set[int]) -> frozenset[int]:
    if comm.ring is None:
        return frozenset()
    members = comm.members
    return frozenset(
        index
        for index, conn in enumerate(comm.ring)
        if members[conn.src] in ranks or members[conn.dst] in ranks
    )


def _conns_touching_port(comm: Comm, port: str) -> frozenset[int]:
    if comm.ring is None:
        return frozenset()
    return frozenset(
        index for index, conn in enumerate(comm.ring) if port in (conn.src_port, conn.dst_port)
    )


@dataclass(frozen=True, slots=True)
class Path:
    """What a ring connection crosses from ``since_ns``: its two ports and fabric links."""

    since_ns: int
    src_port: str | None  # None: NVLink inside a node (no port, no fabric link)
    dst_port: str | None
    links: tuple[str, ...]


def _path_moves(cluster: Cluster, scenario: Scenario, job: PlacedJob) -> dict[str, list[Path]]:
    """Per ``comm/src->dst`` of this job, the paths it was moved to (``path_changes``)."""
    moves: dict[str, list[Path]] = {}
    conns = {
        f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}": conn
        for comm in job.comms
        for conn in (*(comm.ring or ()), *(comm.pairs or ()))
    }
    prefix = f"{job.spec.id}/"
    for change in sorted(scenario.path_changes, key=lambda c: c.at_s):
        conn = conns.get(change.flow)
        if conn is None or conn.src_port is None or conn.dst_port is None:
            continue  # not a connection on the network: nothing a plan moves
        src = change.src_port or conn.src_port
        dst = change.dst_port or conn.dst_port
        links = cluster.path_links(src, dst, change.via)
        moves.setdefault(change.flow.removeprefix(prefix), []).append(
            Path(at_ns(scenario, change.at_s), src, dst, links)
        )
    return moves


def _bandwidth(
    comm: str,
    conns: tuple[Conn, ...],
    start_ns: int,
    port_windows: Mapping[str, list[Window]],
    link_windows: Mapping[str, list[Window]],
    moves: Mapping[str, list[Path]],
) -> Bandwidth:
    # Per connection: its paths over time, each with the windows that slow it.
    per_conn: list[list[tuple[Path, list[Window]]]] = []
    changes = {start_ns}
    for conn in conns:
        flow = f"{comm}/{conn.src}->{conn.dst}"
        paths = [Path(start_ns, conn.src_port, conn.dst_port, conn.links)]
        paths += moves.get(flow, [])
        timed = []
        for path in paths:
            windows: list[Window] = []
            if path.src_port is not None:
                windows += port_windows.get(path.src_port, ())
            if path.dst_port is not None and path.dst_port != path.src_port:
                windows += port_windows.get(path.dst_port, ())
            for link in path.links:
                windows += link_windows.get(link, ())
            timed.append((path, windows))
            changes.add(path.since_ns)
            for window in windows:
                changes.add(window.start_ns)
                if window.end_ns is not None:
                    changes.add(window.end_ns)
        per_conn.append(timed)
    starts = tuple(sorted(changes))
    speeds: list[tuple[float, ...]] = []
    for t in starts:
        row = []
        for conn, timed in zip(conns, per_conn, strict=True):
            gbps = conn.gbps
            windows = timed[0][1]
            for path, path_windows in timed:
                if path.since_ns <= t:
                    windows = path_windows
            for window in windows:
                if window.active(t):
                    gbps *= window.factor
            row.append(gbps)
        speeds.append(tuple(row))
    return Bandwidth(starts, tuple(speeds), tuple(min(row) for row in speeds))
