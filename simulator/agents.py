"""Node agents: what each node reports every interval, on its own clock.

Every node reports at ``start + phase + k * interval`` of its local clock (agents are not in
step) and its timestamps carry the node's small clock offset: comparing enter times across
hosts would mislead, durations on one host do not (DESIGN, principle 3). Per interval a node
sends one collective message per rank per communicator (ops entered or completed in the
interval, empty ops as a heartbeat), one link message per NIC port (cumulative counters) and,
every few intervals, one gpu message per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.base import C4Model
from schemas.messages import Collective, Conns, Gpu, Link, LinkCounters, OpName, Ops
from simulator.cluster import GPUS_PER_NODE, Cluster, Comm, local_port
from simulator.effects import DOWN_SHARE, NS_PER_S, Window, at_ns
from simulator.jobsim import JobRun, OpRun
from simulator.noise import poisson, stream
from simulator.scenario import (
    FabricLinkDegraded,
    FabricLinkDown,
    GpuStop,
    LinkDown,
    NodeDown,
    PortDegraded,
    Scenario,
    SlowGpu,
)

MTU = 4096
BACKGROUND_BYTES = 1_200  # per port and interval: LLDP, subnet management, monitoring
MAX_OFFSET_NS = 3_000_000  # NTP-grade clocks: a few milliseconds apart
OUT_OF_SEQ_PER_S = 40.0  # at factor 0: lost packets seen by receivers behind a bad link
SM_MHZ = 1980.0


@dataclass(slots=True)
class _Member:
    """One rank's view of one communicator: its runs and how far they are reported."""

    job: str
    comm: Comm
    runs: list[OpRun]
    index: int
    rank: int
    port: _Port | None  # the NIC port its ring connections use; None inside a node
    ptr: int = 0


@dataclass(slots=True)
class _Port:
    """A NIC port's cumulative counters and what the faults do to it."""

    local: str
    gbps: float
    counters: dict[str, int]
    down_ns: int | None = None
    degraded: list[tuple[Window, float]] = field(default_factory=list)
    lossy: list[tuple[Window, float]] = field(default_factory=list)
    went_down: bool = False
    tx: int = 0  # traffic of the current interval
    rx: int = 0


@dataclass(slots=True)
class _Gpu:
    index: int
    busy: bool
    stop_ns: int | None = None
    lost: bool = False
    slow: list[Window] = field(default_factory=list)


COUNTERS = (
    "tx_bytes",
    "rx_bytes",
    "tx_pkts",
    "rx_pkts",
    "tx_wait",
    "symbol_err",
    "link_down",
    "rx_err",
    "out_of_seq",
    "cnp_sent",
    "cnp_handled",
    "timeout_retrans",
)


class NodeAgent:
    """The reports of one node."""

    def __init__(self, node: str, scenario: Scenario) -> None:
        self.node = node
        self.interval = round(scenario.interval_s * NS_PER_S)
        self.rng = stream(scenario.seed, "node", node)
        rng = self.rng
        self.phase = int(rng.uniform(0, 0.9) * self.interval)
        limit = min(MAX_OFFSET_NS, self.interval // 20)
        self.offset = max(-limit, min(limit, int(rng.gauss(0, limit / 3))))
        self.first = scenario.start_ns + self.phase
        self.last_k = int((round(scenario.duration_s * NS_PER_S) - self.phase) // self.interval)
        self.down_ns: int | None = None
        self.members: list[_Member] = []
        self.ports: dict[str, _Port] = {}
        self.gpus: list[_Gpu] = []
        self.gpu_every = max(1, round(scenario.gpu_every_s / scenario.interval_s))
        self.blips = scenario.port_error_blips

    def add_port(self, local: str, gbps: float) -> None:
        """A NIC port, with counters as a NIC that has been up for a while reports them."""
        rng = self.rng
        tx, rx = rng.randrange(10**12, 10**15), rng.randrange(10**12, 10**15)
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update(
            tx_bytes=tx,
            rx_bytes=rx,
            tx_pkts=tx // MTU,
            rx_pkts=rx // MTU,
            tx_wait=rng.randrange(0, 10**6),
            symbol_err=rng.choice((0, 0, 0, 1, 2, 5)),
            link_down=rng.choice((0, 0, 1, 2)),
            cnp_sent=rng.randrange(0, 10**4),
            cnp_handled=rng.randrange(0, 10**4),
        )
        self.ports[local] = _Port(local, gbps, counters)

    # --- one report -------------------------------------------------------------------
    def report(self, k: int) -> list[C4Model]:
        """The messages of report ``k`` (none once the node is down)."""
        ts = self.first + k * self.interval
        true_ns = ts - self.offset
        if self.down_ns is not None and true_ns > self.down_ns:
            return []
        out: list[C4Model] = [self._collective(member, ts) for member in self.members]
        out.extend(self._link(port, ts, true_ns) for port in self.ports.values())
        if k % self.gpu_every == 0:
            out.extend(self._gpu(gpu, ts, true_ns) for gpu in self.gpus)
        return out

    def _collective(self, member: _Member, ts: int) -> Collective:
        off, idx = self.offset, member.index
        before = ts - self.interval
        runs = member.runs
        comm = member.comm
        size = len(comm.members)
        ring = comm.ring or ()
        prev = comm.prev[idx] if ring else (idx - 1) % size
        # Only connections between two nodes cross the member's port; NVLink ones do not.
        sends = bool(ring) and ring[idx].src_port is not None
        receives = bool(ring) and ring[prev].src_port is not None
        seqs: list[int] = []
        names: list[OpName] = []
        sizes: list[int] = []
        enters: list[int] = []
        ends: list[int | None] = []
        out_bytes = out_busy = in_bytes = in_busy = 0
        i = member.ptr
        while i < len(runs):
            run = runs[i]
            entered = run.enter[idx]
            if entered is None or entered + off > ts:
                break
            enter = entered + off
            end = None if run.end is None else run.end[idx] + off
            finished = end is not None and end <= ts
            if enter > before or finished:
                # New this interval, or reported in flight before and completed now.
                seqs.append(run.seq)
                names.append(run.op)
                sizes.append(run.nbytes if run.member_bytes is None else run.member_bytes[idx])
                enters.append(enter)
                ends.append(end if finished else None)
            if not finished:
                break  # in flight or hung: the member has started nothing after it
            if member.port is not None and run.busy is not None:
                if sends:
                    out_bytes += run.conn_bytes
                    out_busy += run.busy[idx]
                if receives:
                    in_bytes += run.conn_bytes
                    in_busy += run.busy[prev]
            i += 1
        member.ptr = i
        if member.port is not None and i < len(runs):
            stuck, dead = self._stuck(runs[i], idx, ts)
            out_busy += stuck if sends and idx in dead else 0
            in_busy += stuck if receives and prev in dead else 0
        conns = None
        if member.port is not None:
            member.port.tx += out_bytes
            member.port.rx += in_bytes
            local = member.port.local
            if size == 2:
                # A pair's two directions are two connections to the same peer: each member
                # reports the one it sends on (the other member reports the way back).
                conns = Conns.model_construct(
                    peer=(prev,), port=(local,), bytes=(out_bytes,), busy_ns=(out_busy,)
                )
            else:
                # The connection it sends on (to its ring successor) and the one it receives
                # on, those that cross its port.
                peers = [(ring[idx].dst, out_bytes, out_busy)] if sends else []
                peers += [(prev, in_bytes, in_busy)] if receives else []
                conns = Conns.model_construct(
                    peer=tuple(peer for peer, _, _ in peers),
                    port=(local,) * len(peers),
                    bytes=tuple(sent for _, sent, _ in peers),
                    busy_ns=tuple(busy for _, _, busy in peers),
                )
        return Collective.of(
            job=member.job,
            comm=comm.id,
            comm_size=size,
            rank=idx,
            global_rank=member.rank,
            node=self.node,
            gpu=member.rank % GPUS_PER_NODE,
            ts_ns=ts,
            ops=Ops.model_construct(
                seq=tuple(seqs),
                op=tuple(names),
                bytes=tuple(sizes),
                enter_ns=tuple(enters),
                end_ns=tuple(ends),
            ),
            conns=conns,
            trusted=True,
        )

    def _stuck(self, run: OpRun, idx: int, ts: int) -> tuple[int, frozenset[int]]:
        """How long in this interval a hung operation had data stuck on its dead connections."""
        entered = run.enter[idx]
        if run.end is not None or run.stall is None or entered is None:
            return 0, frozenset()
        since = max(run.stall.since_ns, entered) + self.offset
        return max(0, ts - max(ts - self.interval, since)), run.stall.dead

    def _link(self, port: _Port, ts: int, true_ns: int) -> Link:
        c, rng = port.counters, self.rng
        seconds = self.interval / NS_PER_S
        down = port.down_ns is not None and true_ns >= port.down_ns
        if down and not port.went_down:
            port.went_down = True
            c["link_down"] += 1
        if not down:
            tx, rx = port.tx + BACKGROUND_BYTES, port.rx + BACKGROUND_BYTES
            c["tx_bytes"] += tx
            c["rx_bytes"] += rx
            c["tx_pkts"] += -(-tx // MTU)
            c["rx_pkts"] += -(-rx // MTU)
        for window, rate in port.degraded:
            if window.active(true_ns):
                c["symbol_err"] += poisson(rng, rate * seconds)
        if port.rx:
            for window, factor in port.lossy:
                if window.active(true_ns):
                    c["out_of_seq"] += poisson(rng, OUT_OF_SEQ_PER_S * (1 - factor) * seconds)
        if self.blips and rng.random() < self.blips:
            c["symbol_err"] += 1
        port.tx = port.rx = 0
        return Link.model_construct(
            v=1,
            kind="link",
            node=self.node,
            port=port.local,
            ts_ns=ts,
            state="down" if down else "up",
            gbps=None if down else port.gbps,
            counters=LinkCounters.model_construct(
                tx_bytes=c["tx_bytes"],
                rx_bytes=c["rx_bytes"],
                tx_pkts=c["tx_pkts"],
                rx_pkts=c["rx_pkts"],
                tx_wait=c["tx_wait"],
                symbol_err=c["symbol_err"],
                link_down=c["link_down"],
                rx_err=c["rx_err"],
                out_of_seq=c["out_of_seq"],
                cnp_sent=c["cnp_sent"],
                cnp_handled=c["cnp_handled"],
                timeout_retrans=c["timeout_retrans"],
            ),
        )

    def _gpu(self, gpu: _Gpu, ts: int, true_ns: int) -> Gpu:
        node = self.node
        if gpu.lost:
            # Fallen off the bus: NVML answers nothing but that it is gone.
            return Gpu.model_construct(v=1, kind="gpu", node=node, gpu=gpu.index, ts_ns=ts, xid=())
        if gpu.stop_ns is not None and true_ns >= gpu.stop_ns:
            gpu.lost = True
            return Gpu.model_construct(
                v=1, kind="gpu", node=node, gpu=gpu.index, ts_ns=ts, xid=(79,)
            )
        gauss = self.rng.gauss
        factor = 1.0
        for window in gpu.slow:
            if window.active(true_ns):
                factor *= window.factor
        temp = 64.0 if gpu.busy else 38.0
        power = 560.0 if gpu.busy else 85.0
        throttle = None
        if factor > 1:
            # A slow GPU usually says why: a thermal or power brake lowering its clocks.
            temp += 18
            throttle = ("hw_slowdown",)
        return Gpu.model_construct(
            v=1,
            kind="gpu",
            node=node,
            gpu=gpu.index,
            ts_ns=ts,
            xid=(),
            temp_c=round(temp + gauss(0, 1.5), 1),
            power_w=round(max(0.0, power + gauss(0, 20)), 1),
            sm_mhz=float(round(SM_MHZ / factor)),
            ecc_dbe=0,
            retired_pages=0,
            throttle=throttle,
            nvlink_err=0,
        )


def build_agents(cluster: Cluster, scenario: Scenario, runs: list[JobRun]) -> list[NodeAgent]:
    """One agent per node that hosts a job or a fault (or every node, when asked)."""
    faulted = {
        fault.node
        for fault in scenario.faults
        if isinstance(fault, NodeDown | PortDegraded | LinkDown)
    }
    by_node = {node: run for run in runs for node in run.job.nodes}
    agents: dict[str, NodeAgent] = {}
    for node in cluster.topology.nodes:
        run = by_node.get(node.id)
        if run is None and node.id not in faulted and not scenario.report_idle_nodes:
            continue
        agent = NodeAgent(node.id, scenario)
        for port in node.ports:
            agent.add_port(port.id, port.gbps)
        used = 0
        if run is not None:
            first = run.job.nodes.index(node.id) * GPUS_PER_NODE
            used = min(GPUS_PER_NODE, run.job.spec.ranks - first)
            _add_members(agent, run, first, used)
        agent.gpus = [_Gpu(g, g < used) for g in range(node.gpus)]
        agents[node.id] = agent
    _apply_faults(cluster, scenario, agents)
    return sorted(agents.values(), key=lambda agent: (agent.phase, agent.node))


def _add_members(agent: NodeAgent, run: JobRun, first: int, used: int) -> None:
    on_node = range(first, first + used)
    for comm in run.job.comms:
        for index, rank in enumerate(comm.members):
            if rank not in on_node:
                continue
            on_port = comm.on_port(index)
            port = agent.ports[local_port(rank % GPUS_PER_NODE)] if on_port else None
            member = _Member(run.job.spec.id, comm, run.runs[comm.id], index, rank, port)
            agent.members.append(member)
    # Each rank's reports in a fixed order: by rank, then communicator.
    agent.members.sort(key=lambda member: member.rank)


def _apply_faults(cluster: Cluster, scenario: Scenario, agents: dict[str, NodeAgent]) -> None:
    for fault in scenario.faults:
        onset = at_ns(scenario, fault.at_s)
        if isinstance(fault, NodeDown) and fault.node in agents:
            agent = agents[fault.node]
            agent.down_ns = onset if agent.down_ns is None else min(agent.down_ns, onset)
        elif isinstance(fault, LinkDown) and fault.node in agents:
            port = agents[fault.node].ports[fault.port]
            if port.down_ns is None or onset < port.down_ns:
                port.down_ns = onset
        elif isinstance(fault, PortDegraded) and fault.node in agents:
            until = None if fault.until_s is None else at_ns(scenario, fault.until_s)
            rate = fault.symbol_err_per_s
            if rate is None:
                rate = 200.0 * (1 - fault.factor)
            window = Window(onset, until, fault.factor)
            agents[fault.node].ports[fault.port].degraded.append((window, rate))
        elif isinstance(fault, FabricLinkDegraded | FabricLinkDown):
            if isinstance(fault, FabricLinkDown):
                window = Window(onset, None, DOWN_SHARE)
            else:
                until = None if fault.until_s is None else at_ns(scenario, fault.until_s)
                window = Window(onset, until, fault.factor)
            for job in cluster.jobs:
                for comm in job.comms:
                    for conn in comm.network():
                        if fault.link in conn.links:
                            node, _, local = str(conn.dst_port).partition("/")
                            if node in agents:
                                agents[node].ports[local].lossy.append((window, window.factor))
        elif isinstance(fault, SlowGpu | GpuStop):
            job = cluster.job(fault.job)
            host = agents.get(job.node_of(fault.rank))
            if host is None:
                continue
            gpu = host.gpus[fault.rank % GPUS_PER_NODE]
            if isinstance(fault, GpuStop):
                gpu.stop_ns = onset if gpu.stop_ns is None else min(gpu.stop_ns, onset)
            else:
                until = None if fault.until_s is None else at_ns(scenario, fault.until_s)
                gpu.slow.append(Window(onset, until, fault.factor))
