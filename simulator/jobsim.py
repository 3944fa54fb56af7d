"""The timing of one job: iterations of compute and ring collectives, in event time.

Each iteration is a few steps; a step is compute (per rank, with jitter) followed by one
collective per communicator of the step's kind. A rank enters a collective when its compute
ends; every member completes together at max(enter) + transfer, where the transfer of a ring
is 2(n-1)/n x bytes (allreduce; (n-1)/n for allgather, reducescatter) over the slowest ring
connection, plus a per-step latency. A rank in an operation that never finishes, or one that
stopped, issues nothing more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from schemas.messages import OpName
from simulator.cluster import NVLINK_GBPS, Comm, PlacedJob
from simulator.effects import NS_PER_S, Breakage, JobEffects, at_ns
from simulator.noise import stream
from simulator.scenario import JobSpec, Scenario

PERSISTENT_SIGMA = 0.003  # GPUs of one model differ a little, for good
COMMON_SIGMA = 0.02  # iterations differ (data, sequence lengths) for every rank alike
HICCUP_CHANCE = 0.002  # per rank and step: OS noise, a slow data loader batch
TRANSFER_SIGMA = 0.02
LAUNCH_NS = 30_000  # from the end of compute to the kernel launch
END_SKEW_NS = 20_000  # the last ring step reaches members at slightly different times
RDMA_STEP_NS = 5_000  # per ring step over the NICs
NVLINK_STEP_NS = 2_000
EARLY_SHARE = 0.05  # compute before a ZeRO/FSDP-style leading collective (parameter gather)
STARTUP_NS = (50_000_000, 300_000_000)  # process start and NCCL init before the first step


@dataclass(frozen=True, slots=True)
class Step:
    """Compute (``share`` of the iteration's compute), then one collective of ``kind``."""

    kind: str
    op: OpName
    nbytes: int
    share: float


@dataclass(slots=True)
class OpRun:
    """One operation of one communicator, as every member saw it (event-time ns)."""

    seq: int
    op: OpName
    nbytes: int
    enter: list[int | None]  # per member; None: never entered
    end: list[int] | None  # per member; None: never finishes
    conn_bytes: int  # what each ring connection carried (0 inside a node)
    busy: list[int] | None  # per ring connection k -> k+1: time with data in flight
    stall: Breakage | None = None  # why a hung operation hangs, when a fault broke the comm
    # Per member, when members move different bytes (an all-to-all's uneven token split).
    member_bytes: list[int] | None = None


@dataclass(slots=True)
class JobRun:
    """Every operation of every communicator of one job."""

    job: PlacedJob
    runs: dict[str, list[OpRun]] = field(default_factory=dict)


def plan(spec: JobSpec) -> tuple[Step, ...]:
    """The steps of one iteration: leading dp collectives, a tp allreduce, the last dp one."""
    dp_ops = spec.dp_ops
    steps = [Step("dp", op, spec.op_bytes, EARLY_SHARE) for op in dp_ops[:-1]]
    rest = 1.0 - EARLY_SHARE * (len(dp_ops) - 1)
    if "tp" in spec.comms:
        tp_bytes = spec.tp_bytes or max(1, spec.op_bytes // 4)
        steps.append(Step("tp", "allreduce", tp_bytes, rest / 2))
        rest /= 2
    steps.append(Step("dp", dp_ops[-1], spec.op_bytes, rest))
    return tuple(steps)


def simulate_job(job: PlacedJob, effects: JobEffects, scenario: Scenario) -> JobRun:
    """Run the job from the scenario start until every rank is past its end (or stuck)."""
    return _JobSim(job, effects, scenario).run()


class _JobSim:
    def __init__(self, job: PlacedJob, effects: JobEffects, scenario: Scenario) -> None:
        self.job = job
        self.effects = effects
        self.spec = job.spec
        self.rng = stream(scenario.seed, "job", job.spec.id)
        n = job.spec.ranks
        rng = self.rng
        self.ready = [scenario.start_ns + rng.randint(*STARTUP_NS) for _ in range(n)]
        self.blocked = [False] * n
        self.live = n
        self.persist = [math.exp(rng.gauss(0, PERSISTENT_SIGMA)) for _ in range(n)]
        self.limit = scenario.start_ns + round(
            (scenario.duration_s + 2 * scenario.interval_s) * 1e9
        )
        self.result = JobRun(job, {comm.id: [] for comm in job.comms})
        self.by_kind: dict[str, list[Comm]] = {}
        for comm in job.comms:
            self.by_kind.setdefault(comm.kind, []).append(comm)
        self.pauses = sorted(
            (at_ns(scenario, c.at_s), round(c.pause_s * NS_PER_S))
            for c in scenario.checkpoints
            if c.job == job.spec.id
        )

    def run(self) -> JobRun:
        steps = plan(self.spec)
        compute_ns = self.spec.compute_ms * 1e6
        rng = self.rng
        while self.live:
            alive = [self.ready[r] for r in range(self.spec.ranks) if not self.blocked[r]]
            if min(alive) > self.limit:
                break
            self._checkpoint(max(alive))
            common = math.exp(rng.gauss(0, COMMON_SIGMA))
            for step in steps:
                enters = self._compute(compute_ns * step.share * common)
                for comm in self.by_kind[step.kind]:
                    self._collective(comm, step, enters)
        return self.result

    def _checkpoint(self, now: int) -> None:
        """A checkpoint due: every rank saves its shard, some a little longer than others."""
        while self.pauses and self.pauses[0][0] <= now:
            _, pause = self.pauses.pop(0)
            for r in range(self.spec.ranks):
                if not self.blocked[r]:
                    self.ready[r] += round(pause * (1 + abs(self.rng.gauss(0, 0.01))))

    def _compute(self, base: float) -> list[int | None]:
        """When each rank enters the step's collective (None: it never will)."""
        rng, gauss, random = self.rng, self.rng.gauss, self.rng.random
        sigma = self.spec.jitter
        slow, stop = self.effects.slow, self.effects.stop_ns
        ready, blocked, persist = self.ready, self.blocked, self.persist
        enters: list[int | None] = [None] * self.spec.ranks
        for r in range(self.spec.ranks):
            if blocked[r]:
                continue
            compute = base * persist[r] * math.exp(gauss(0, sigma))
            if random() < HICCUP_CHANCE:
                compute *= 1 + rng.uniform(0.03, 0.15)
            if r in slow:
                compute *= self.effects.slow_factor(r, ready[r])
            enter = ready[r] + int(compute) + LAUNCH_NS
            if r in stop and enter > stop[r]:
                blocked[r] = True  # the GPU or process is gone: it never enters
                self.live -= 1
                continue
            enters[r] = enter
        return enters

    def _block(self, members: tuple[int, ...]) -> None:
        for m in members:
            if not self.blocked[m]:
                self.blocked[m] = True
                self.live -= 1

    def _collective(self, comm: Comm, step: Step, enters: list[int | None]) -> None:
        members = comm.members
        size = len(members)
        runs = self.result.runs[comm.id]
        seq = len(runs)
        entered = [enters[m] for m in members]
        if step.op == "allreduce":
            conn_bytes, ring_steps = 2 * (size - 1) * step.nbytes // size, 2 * (size - 1)
        else:
            conn_bytes, ring_steps = (size - 1) * step.nbytes // size, size - 1
        carried = 0 if comm.ring is None else conn_bytes  # NVLink bytes cross no NIC port
        breakage = self.effects.broken.get(comm.id)
        if None in entered:
            # Someone never enters: the others wait inside the operation for ever.
            self._block(members)
            runs.append(OpRun(seq, step.op, step.nbytes, entered, None, 0, None, breakage))
            return
        start = max(e for e in entered if e is not None)
        bits = conn_bytes * 8
        rng = self.rng
        if comm.ring is None:
            slowest, step_ns, speeds = NVLINK_GBPS, NVLINK_STEP_NS, None
        else:
            bandwidth = self.effects.bandwidth[comm.id]
            epoch = bandwidth.epoch(start)
            slowest, step_ns = bandwidth.slowest[epoch], RDMA_STEP_NS
            speeds = bandwidth.conn_gbps[epoch]
        wire = bits / slowest  # Gbit/s is bits per ns
        transfer = int(ring_steps * step_ns + wire * math.exp(rng.gauss(0, TRANSFER_SIGMA)))
        done = start + transfer
        if breakage is not None and done > breakage.since_ns:
            self._block(members)
            runs.append(OpRun(seq, step.op, step.nbytes, entered, None, 0, None, breakage))
            return
        random = rng.random
        ends = [done + int(random() * END_SKEW_NS) for _ in range(size)]
        busy = None
        if speeds is not None:
            # A fast connection of a ring idles while it waits for the slowest one's data;
            # its busy time is what its own speed needs for the bytes.
            gauss = rng.gauss
            busy = [
                max(1, min(transfer, int(bits / gbps * (1 + abs(gauss(0, 0.01))))))
                for gbps in speeds
            ]
        ready = self.ready
        for m, end in zip(members, ends, strict=True):
            ready[m] = end
        runs.append(OpRun(seq, step.op, step.nbytes, entered, ends, carried, busy))
