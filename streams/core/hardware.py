"""Hardware signals: NIC port counters and state, GPU XIDs and ECC errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas.messages import Diagnosis, DiagnosisClass, Gpu, Link
from streams.core.findings import FindingBook, SuspectScore
from streams.core.params import NS_PER_S, DetectorParams
from streams.core.places import gpu_id, port_id

# XIDs that mean the hardware (DESIGN, Detection); 13, 31, 43 are the application's.
HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
CLEAN_REPORTS_TO_RESOLVE = 3
GPU_FAULT_CLEAR_NS = 600 * NS_PER_S


@dataclass(slots=True)
class PortState:
    """The last report of one port and what it showed."""

    ts_ns: int
    symbol_err: int | None
    retrans: int | None
    down: bool
    max_gbps: float
    degraded: bool = False
    clean_streak: int = 0
    bad_streak: int = 0

    def row(self) -> list[Any]:
        """The fields in order, as `PortState(*row)` takes them back (no deep copy: all
        are scalars, and `dataclasses.astuple` copying them was a tenth of a live worker)."""
        return [
            self.ts_ns,
            self.symbol_err,
            self.retrans,
            self.down,
            self.max_gbps,
            self.degraded,
            self.clean_streak,
            self.bad_streak,
        ]


class HardwareMonitor:
    """Findings from link and GPU messages; also answers `PortHealth` for the job detectors."""

    def __init__(
        self,
        params: DetectorParams,
        job_of_port: Callable[[str], str | None],
        job_of_gpu: Callable[[str], str | None],
        placements_pending: Callable[[], bool] = lambda: False,
    ) -> None:
        self.params = params
        self._job_of_port = job_of_port
        self._job_of_gpu = job_of_gpu
        # Live, while placements may still be on their way (the worker has not caught up on
        # the job topic), a finding on a part of no known job waits for them: otherwise its
        # job would depend on which topic the worker happened to read first.
        self._placements_pending = placements_pending
        self._deferred: dict[tuple[str, str], _Deferred] = {}
        self._ports: dict[str, PortState] = {}
        self._node_reported: dict[str, int] = {}  # node -> its latest port report's ts
        self._gpu_faults: dict[str, int] = {}  # gpu id -> last hardware error ts
        self._ecc: dict[str, int] = {}
        self.book = FindingBook()
        self._owner: dict[tuple[str, str], tuple[str | None]] = {}
        self._health_version = 0  # moves when any port's down or degraded changes

    # --- PortHealth ------------------------------------------------------------------
    def is_down(self, port: str) -> bool:
        """The port's last report said down."""
        state = self._ports.get(port)
        return state is not None and state.down

    def errors_rising(self, port: str) -> bool:
        """The port is degraded by its counters."""
        state = self._ports.get(port)
        return state is not None and state.degraded

    def health_version(self) -> int:
        """Moves whenever ``is_down`` or ``errors_rising`` of any port changes."""
        return self._health_version

    def reported_at(self, port: str) -> int | None:
        """Event time of the port's latest report held here; None if none came."""
        state = self._ports.get(port)
        return None if state is None else state.ts_ns

    def node_reported_at(self, node: str) -> int | None:
        """Event time of the latest report of any port of ``node``; None if none came."""
        return self._node_reported.get(node)

    # --- input -----------------------------------------------------------------------
    def on_link(self, message: Link) -> list[Diagnosis]:
        """Take one port report; fire or resolve link_down / link_degraded."""
        pid = port_id(message.node, message.port)
        counters = message.counters
        retrans = counters.timeout_retrans
        previous = self._ports.get(pid)
        if previous is not None and message.ts_ns <= previous.ts_ns:
            return []  # a repeated or reordered report (a redelivery): no new rates in it
        gbps = message.gbps or 0.0
        state = PortState(
            message.ts_ns,
            counters.symbol_err,
            retrans,
            message.state == "down",
            max(gbps, previous.max_gbps if previous else 0.0),
        )
        out: list[Diagnosis] = []
        if state.down:
            self._fire(
                out,
                "link_down",
                pid,
                message.ts_ns,
                message.ts_ns,
                (SuspectScore("port", pid, 0.97),),
                {"state": "down"},
            )
        else:
            self._resolve(out, "link_down", pid, message.ts_ns)
        if previous is not None:
            state.degraded, state.clean_streak = previous.degraded, previous.clean_streak
            state.bad_streak = previous.bad_streak
            self._update_degraded(pid, previous, state, gbps, out)
        if (state.down, state.degraded) != (
            (previous.down, previous.degraded) if previous is not None else (False, False)
        ):
            self._health_version += 1
        self._ports[pid] = state
        if message.ts_ns > self._node_reported.get(message.node, -1):
            self._node_reported[message.node] = message.ts_ns
        return out

    def _fire(
        self,
        out: list[Diagnosis],
        cls: DiagnosisClass,
        key: str,
        onset: int,
        now: int,
        suspects: tuple[SuspectScore, ...],
        evidence: dict[str, Any],
    ) -> None:
        # The finding's job is the one placed on the part when it fires; it resolves there.
        owner = self._owner.get((cls, key))
        if owner is None:
            lookup = self._job_of_gpu if suspects[0].type == "gpu" else self._job_of_port
            job = lookup(key)
            if job is None and self._placements_pending():
                self._deferred.setdefault((cls, key), _Deferred(cls, onset, suspects, evidence))
                return
            owner = (job,)
            self._owner[(cls, key)] = owner
            deferred = self._deferred.pop((cls, key), None)
            if deferred is not None:
                onset, evidence = deferred.onset, deferred.evidence
        fired = self.book.fire(owner[0], cls, key, onset, now, suspects, evidence)
        if fired is not None:
            out.append(fired)

    def release_deferred(self, now: int) -> list[Diagnosis]:
        """Fire the deferred findings whose job is known now, or all once none can come."""
        out: list[Diagnosis] = []
        if not self._deferred:
            return out  # asked only while something waits: a live wait's timer starts then
        pending = self._placements_pending()
        for (_, key), deferred in list(self._deferred.items()):
            lookup = self._job_of_gpu if deferred.suspects[0].type == "gpu" else self._job_of_port
            if not pending or lookup(key) is not None:
                self._fire_deferred(out, key, deferred, now)
        return out

    def _fire_deferred(self, out: list[Diagnosis], key: str, deferred: _Deferred, now: int) -> None:
        del self._deferred[(deferred.cls, key)]
        lookup = self._job_of_gpu if deferred.suspects[0].type == "gpu" else self._job_of_port
        self._owner[(deferred.cls, key)] = (lookup(key),)
        self._fire(
            out, deferred.cls, key, deferred.onset, now, deferred.suspects, deferred.evidence
        )

    def _resolve(self, out: list[Diagnosis], cls: str, key: str, now: int) -> None:
        deferred = self._deferred.get((cls, key))
        if deferred is not None:  # it fired (as a replay would have said), then resolves
            self._fire_deferred(out, key, deferred, now)
        owner = self._owner.pop((cls, key), None)
        if owner is not None and (resolved := self.book.resolve(owner[0], cls, key, now)):
            out.append(resolved)

    def _update_degraded(
        self, pid: str, previous: PortState, state: PortState, gbps: float, out: list[Diagnosis]
    ) -> None:
        seconds = max((state.ts_ns - previous.ts_ns) / NS_PER_S, 1e-3)
        symbol_rate = _rate(previous.symbol_err, state.symbol_err, seconds)
        retrans_rate = _rate(previous.retrans, state.retrans, seconds)
        slowed = 0 < gbps < 0.9 * previous.max_gbps
        bad = (
            symbol_rate >= self.params.symbol_err_per_s
            or retrans_rate >= self.params.retrans_per_s
            or slowed
        )
        if bad and not state.down:
            state.clean_streak = 0
            state.bad_streak += 1
            if not state.degraded and state.bad_streak >= self.params.degraded_reports:
                state.degraded = True
                evidence = {
                    "symbol_err_per_s": round(symbol_rate, 2),
                    "retrans_per_s": round(retrans_rate, 2),
                    "gbps": gbps,
                }
                self._fire(
                    out,
                    "link_degraded",
                    pid,
                    previous.ts_ns,
                    state.ts_ns,
                    (SuspectScore("port", pid, 0.9),),
                    evidence,
                )
        else:
            state.bad_streak = 0
            if state.degraded:
                state.clean_streak += 1
                if state.clean_streak >= CLEAN_REPORTS_TO_RESOLVE:
                    state.degraded = False
                    self._resolve(out, "link_degraded", pid, state.ts_ns)

    def on_gpu(self, message: Gpu) -> list[Diagnosis]:
        """Take one GPU report; fire gpu_fault on hardware XIDs or new double-bit ECC errors."""
        gid = gpu_id(message.node, message.gpu)
        hardware = sorted({x for x in message.xid if x in HARDWARE_XIDS})
        ecc_before = self._ecc.get(gid)
        if message.ecc_dbe is not None:
            self._ecc[gid] = message.ecc_dbe
        new_ecc = (
            message.ecc_dbe is not None and ecc_before is not None and message.ecc_dbe > ecc_before
        )
        out: list[Diagnosis] = []
        if hardware or new_ecc:
            self._gpu_faults[gid] = message.ts_ns
            evidence: dict[str, Any] = {"xid": hardware, "ecc_dbe": message.ecc_dbe}
            self._fire(
                out,
                "gpu_fault",
                gid,
                message.ts_ns,
                message.ts_ns,
                (SuspectScore("gpu", gid, 0.98),),
                evidence,
            )
        return out

    # --- snapshot ----------------------------------------------------------------------
    def nodes(self) -> set[str]:
        """The nodes this monitor holds state of."""
        return {node_of(key) for key in (*self._ports, *self._gpu_faults, *self._ecc)}

    def node_states(self, nodes: set[str]) -> dict[str, dict[str, Any]]:
        """The state of each of ``nodes`` this monitor holds anything of, as plain data.

        One pass over the monitor, however many nodes are asked for: a worker snapshots all
        its changed nodes at once.
        """
        out: dict[str, dict[str, Any]] = {}

        def entry(part: str) -> dict[str, Any] | None:
            node = node_of(part)
            if node not in nodes:
                return None
            if node not in out:
                out[node] = empty_node_state()
            return out[node]

        for pid, port in self._ports.items():
            if (found := entry(pid)) is not None:
                found["ports"].append([pid, *port.row()])
        for gid, ts in self._gpu_faults.items():
            if (found := entry(gid)) is not None:
                found["gpu_faults"][gid] = ts
        for gid, count in self._ecc.items():
            if (found := entry(gid)) is not None:
                found["ecc"][gid] = count
        for row in self.book.state(lambda key: node_of(key) in nodes):
            if (found := entry(row[2])) is not None:
                found["findings"].append(row)
        for (cls, key), (job,) in self._owner.items():
            if (found := entry(key)) is not None:
                found["owners"].append([cls, key, job])
        return out

    def restore_node(self, state: dict[str, Any]) -> None:
        """Take one node's state from a snapshot."""
        self._health_version += 1
        for pid, *fields in state["ports"]:
            port = self._ports[pid] = PortState(*fields)
            node = node_of(pid)
            if port.ts_ns > self._node_reported.get(node, -1):
                self._node_reported[node] = port.ts_ns
        self._gpu_faults.update(state["gpu_faults"])
        self._ecc.update(state["ecc"])
        self.book.restore(state["findings"])
        for cls, key, job in state["owners"]:
            self._owner[(cls, key)] = (job,)

    def drop_node(self, node: str) -> None:
        """Forget one node's state (another worker holds it now)."""
        self._health_version += 1
        for table in (self._ports, self._gpu_faults, self._ecc):
            for key in [k for k in table if node_of(k) == node]:
                del table[key]
        for cls, key in [ck for ck in self._owner if node_of(ck[1]) == node]:
            del self._owner[(cls, key)]
        for cls, key in [ck for ck in self._deferred if node_of(ck[1]) == node]:
            del self._deferred[(cls, key)]
        self._node_reported.pop(node, None)
        self.book.drop(lambda key: node_of(key) == node)

    def check(self, now_ns: int) -> list[Diagnosis]:
        """Resolve GPU faults after a long time without a new hardware error."""
        out = self.release_deferred(now_ns) if self._deferred else []
        for gid, last in list(self._gpu_faults.items()):
            if now_ns - last >= GPU_FAULT_CLEAR_NS:
                del self._gpu_faults[gid]
                self._resolve(out, "gpu_fault", gid, now_ns)
        return out


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A hardware finding waiting for the placement of its part (see `HardwareMonitor`)."""

    cls: DiagnosisClass
    onset: int
    suspects: tuple[SuspectScore, ...]
    evidence: dict[str, Any]


def node_of(part: str) -> str:
    """The node of a global port or GPU id (``node-003/mlx5_0:1``, ``node-003/gpu1``)."""
    return part.split("/", 1)[0]


def _rate(before: int | None, after: int | None, seconds: float) -> float:
    if before is None or after is None or after < before:
        return 0.0  # missing, or a counter reset: no rate from this pair
    return (after - before) / seconds


def empty_node_state() -> dict[str, Any]:
    """A node's hardware state with nothing in it (what `restore_node` reads, all empty)."""
    return {"ports": [], "gpu_faults": {}, "ecc": {}, "findings": [], "owners": []}
