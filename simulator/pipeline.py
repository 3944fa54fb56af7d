"""The timing of a 3D-parallel (and MoE) job: every rank runs its own program, in event time.

A rank's iteration is a 1F1B pipeline schedule over ``microbatches``: a forward is attention
compute, a tensor-parallel allreduce, the MLP (for MoE: an all-to-all dispatch, the experts'
compute scaled by the tokens they got, an all-to-all combine) and a second allreduce; a
backward is the same at twice the compute. Neighbouring stages exchange activations and
gradients with send/recv on their pair's communicator (in steady state one coalesced
send+recv, as Megatron's ``send_forward_recv_backward``). After the pipeline flush the
data-parallel group reduces the gradients in back-to-back buckets, the optimizer steps and
the parameters are gathered again.

Every operation synchronises its members: each enters when its program reaches it, all
complete at max(enter) + transfer. A rank that stopped enters nothing more; an operation some
member never enters, or one a fault broke, never completes, and its members issue nothing
after it. Iterations are run one after another for every rank (a pipeline flushes at the end
of each), until the scenario's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from schemas.messages import OpName
from simulator.cluster import NVLINK_GBPS, Comm, PlacedJob
from simulator.effects import NS_PER_S, JobEffects, at_ns
from simulator.interleaved import schedule
from simulator.jobsim import (
    COMMON_SIGMA,
    END_SKEW_NS,
    HICCUP_CHANCE,
    LAUNCH_NS,
    NVLINK_STEP_NS,
    RDMA_STEP_NS,
    STARTUP_NS,
    TRANSFER_SIGMA,
    JobRun,
    OpRun,
)
from simulator.layout import coords, data_parallel_size
from simulator.noise import stream
from simulator.scenario import Parallel, Scenario

ATTENTION_SHARE = 0.4  # of a forward's compute, before the first tensor-parallel allreduce
EXPERT_SHARE = 0.5  # of the MLP's compute that runs in the experts (scaled by their load)
OPTIMIZER_SHARE = 0.6  # optimizer step, in forwards' worth of compute
BUCKET_GAP_NS = 150_000  # between back-to-back gradient buckets
LOADER_STALL_MS = (30.0, 250.0)


@dataclass(frozen=True, slots=True)
class Compute:
    """Compute of ``base_ns`` (before the rank's speed, jitter and faults)."""

    base_ns: float


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation on a communicator; ``nbytes`` per member where they differ."""

    comm: int  # index into the job's communicators
    op: OpName
    nbytes: int
    member_bytes: tuple[int, ...] | None = None


Instruction = Compute | Operation


@dataclass(slots=True)
class _Pending:
    """An operation some members entered: when each entered."""

    op: OpName
    nbytes: int
    member_bytes: tuple[int, ...] | None
    enter: list[int | None]
    count: int = 0


@dataclass(slots=True)
class _Rank:
    """A rank's progress through its current program."""

    t: int
    program: list[Instruction] = field(default_factory=list)
    pc: int = 0
    blocked: bool = False  # stopped, or inside an operation that will never complete
    waiting: bool = False  # entered an operation not all members have entered yet


@dataclass(frozen=True, slots=True)
class _Roles:
    """The communicators (indices) of one rank."""

    stage: int
    tp: int | None
    dp: int | None
    ep: int | None
    prev: int | None  # the pair with the previous stage
    next: int | None  # the pair with the next stage


def simulate_parallel_job(job: PlacedJob, effects: JobEffects, scenario: Scenario) -> JobRun:
    """Run a 3D-parallel job from the scenario start until every rank is past its end."""
    return _ParallelSim(job, effects, scenario).run()


class _ParallelSim:
    def __init__(self, job: PlacedJob, effects: JobEffects, scenario: Scenario) -> None:
        spec = job.spec
        assert spec.parallel is not None  # noqa: S101 - only 3D jobs come here
        self.shape: Parallel = spec.parallel
        self.job = job
        self.effects = effects
        self.rng = stream(scenario.seed, "job", spec.id)
        rng = self.rng
        n = spec.ranks
        self.dp = data_parallel_size(spec, self.shape)
        self.comms: list[Comm] = list(job.comms)
        self.index_of = [{rank: i for i, rank in enumerate(c.members)} for c in self.comms]
        self.roles = [self._roles(rank) for rank in range(n)]
        spread = self.shape.gpu_spread
        self.speed = [1.0 + rng.uniform(-spread, spread) for _ in range(n)]
        self.ranks = [_Rank(scenario.start_ns + rng.randint(*STARTUP_NS)) for _ in range(n)]
        self.issued = [[0] * len(c.members) for c in self.comms]
        self.pending: list[dict[int, _Pending]] = [{} for _ in self.comms]
        self.result = JobRun(job, {comm.id: [] for comm in job.comms})
        self.open: list[dict[int, OpRun]] = [{} for _ in self.comms]
        self.limit = scenario.start_ns + round(
            (scenario.duration_s + 2 * scenario.interval_s) * NS_PER_S
        )
        self.pauses = sorted(
            (at_ns(scenario, c.at_s), round(c.pause_s * NS_PER_S))
            for c in scenario.checkpoints
            if c.job == spec.id
        )
        self.slowdowns = [
            (at_ns(scenario, s.at_s), at_ns(scenario, s.until_s), s.factor)
            for s in scenario.slowdowns
            if s.job == spec.id
        ]

    def _roles(self, rank: int) -> _Roles:
        where = coords(self.shape, self.dp, rank)
        tp = dp = ep = prev = nxt = None
        for index, comm in enumerate(self.comms):
            if rank not in comm.members:
                continue
            if comm.kind == "tp":
                tp = index
            elif comm.kind == "dp":
                dp = index
            elif comm.kind == "ep":
                ep = index
            elif comm.kind == "pp":
                other = comm.members[0] if comm.members[1] == rank else comm.members[1]
                stage = coords(self.shape, self.dp, other).pp
                pp = self.shape.pp
                if self.shape.virtual_stages > 1:  # neighbours round the ring of stages
                    if stage == (where.pp - 1) % pp:
                        prev = index
                    if stage == (where.pp + 1) % pp:
                        nxt = index
                elif stage < where.pp:
                    prev = index
                else:
                    nxt = index
        return _Roles(where.pp, tp, dp, ep, prev, nxt)

    # --- programs ----------------------------------------------------------------------
    def _pass(self, roles: _Roles, base: float, member: int) -> list[Instruction]:
        """One forward (``base`` = its compute) or backward through the stage's layers."""
        shape = self.shape
        out: list[Instruction] = [Compute(base * ATTENTION_SHARE)]
        if roles.tp is not None:
            out.append(Operation(roles.tp, "allreduce", shape.tp_bytes))
        mlp = base * (1 - ATTENTION_SHARE)
        if roles.ep is not None:
            size = len(self.comms[roles.ep].members)
            # The combine sends each expert's tokens back: the busiest expert sends the most.
            combine_bytes = tuple(
                max(1, round(shape.a2a_bytes * self._load(roles.ep, i))) for i in range(size)
            )
            out += [
                Compute(mlp * (1 - EXPERT_SHARE)),
                Operation(roles.ep, "alltoall", shape.a2a_bytes),
                Compute(mlp * EXPERT_SHARE * self._load(roles.ep, member)),
                Operation(roles.ep, "alltoall", max(combine_bytes), combine_bytes),
            ]
        else:
            out.append(Compute(mlp))
        if roles.tp is not None:
            out.append(Operation(roles.tp, "allreduce", shape.tp_bytes))
        return out

    def _load(self, ep: int, member: int) -> float:
        """The share of tokens (1 = even) an expert gets in this iteration."""
        hot = self._hot.get(ep)
        extra = self.shape.hot_expert_load
        size = len(self.comms[ep].members)
        if hot is None or extra <= 0:
            return 1.0
        return 1.0 + extra if member == hot else max(0.05, 1.0 - extra / (size - 1))

    def _program(self, rank: int) -> list[Instruction]:
        """One iteration of one rank: the 1F1B schedule, then the data-parallel step."""
        shape = self.shape
        roles = self.roles[rank]
        fwd = shape.forward_ms * 1e6
        member = self.index_of[roles.ep][rank] if roles.ep is not None else 0
        act = shape.activation_bytes
        forward = self._pass(roles, fwd, member)
        backward = self._pass(roles, 2 * fwd, member)
        prev, nxt = roles.prev, roles.next
        m = shape.microbatches
        warmup = min(shape.pp - roles.stage - 1, m)
        out: list[Instruction] = []
        if shape.virtual_stages > 1:
            out = self._interleaved(roles, fwd / shape.virtual_stages, member)
            warmup = m = 0  # the pipeline part is done: on to the data-parallel step
        for _ in range(warmup):
            if prev is not None:
                out.append(Operation(prev, "recv", act))
            out += forward
            if nxt is not None:
                out.append(Operation(nxt, "send", act))
        steady = m - warmup
        if steady and prev is not None:
            out.append(Operation(prev, "recv", act))
        for _ in range(steady):
            out += forward
            if nxt is not None:
                out.append(Operation(nxt, "send", act))  # send forward, receive backward
            out += backward
            if prev is not None:
                # Send backward, and receive the next forward unless this was the last.
                out.append(Operation(prev, "send", act))
        for _ in range(warmup):
            if nxt is not None:
                out.append(Operation(nxt, "recv", act))
            out += backward
            if prev is not None:
                out.append(Operation(prev, "send", act))
        if roles.dp is not None:
            for _ in range(shape.dp_buckets):
                out.append(Operation(roles.dp, "reducescatter", shape.bucket_bytes))
                out.append(Compute(BUCKET_GAP_NS))
        out.append(Compute(fwd * OPTIMIZER_SHARE))
        if roles.dp is not None:
            for _ in range(shape.dp_buckets):
                out.append(Operation(roles.dp, "allgather", shape.bucket_bytes))
                out.append(Compute(BUCKET_GAP_NS))
        return out

    def _interleaved(self, roles: _Roles, chunk_ns: float, member: int) -> list[Instruction]:
        """The interleaved 1F1B part of an iteration: a chunk's pass, then the exchanges."""
        shape = self.shape
        act = shape.activation_bytes
        forward = self._pass(roles, chunk_ns, member)
        backward = self._pass(roles, 2 * chunk_ns, member)
        # Pairs in one order on every stage (even stages: next first), so that no ring of
        # stages waits on itself; two stages share one pair, entered once.
        first_next = roles.stage % 2 == 0
        out: list[Instruction] = []
        for step in schedule(shape.pp, shape.microbatches, shape.virtual_stages)[roles.stage]:
            if step.unit is not None:
                out += backward if step.unit.backward else forward
            exchanges = [(step.with_next, roles.next, step.sends_next)]
            exchanges.append((step.with_prev, roles.prev, step.sends_prev))
            if roles.next == roles.prev:  # two stages: both directions on their one pair
                exchanges = [
                    (
                        step.with_next or step.with_prev,
                        roles.next,
                        step.sends_next or step.sends_prev,
                    )
                ]
            elif not first_next:
                exchanges.reverse()
            for happens, comm, sends in exchanges:
                if happens and comm is not None:
                    out.append(Operation(comm, "send" if sends else "recv", act))
        return out

    # --- the run -----------------------------------------------------------------------
    def run(self) -> JobRun:
        rng = self.rng
        ranks = self.ranks
        while True:
            live = [r for r in ranks if not r.blocked]
            if not live or min(r.t for r in live) > self.limit:
                break
            self._pause(max(r.t for r in live))
            self._common = math.exp(rng.gauss(0, COMMON_SIGMA))
            self._hot = {
                index: rng.randrange(len(comm.members))
                for index, comm in enumerate(self.comms)
                if comm.kind == "ep"
            }
            for rank, state in enumerate(ranks):
                if not state.blocked:
                    state.program = self._program(rank)
                    state.pc = 0
                    self._stall(rank, state)
            self._drain(list(range(len(ranks))))
            for state in ranks:
                # Still waiting once every rank ran as far as it can: it waits for ever.
                if state.waiting:
                    state.blocked = True
        self._flush_open()
        return self.result

    def _pause(self, now: int) -> None:
        """A checkpoint due: every rank saves its shard, some a little longer than others."""
        while self.pauses and self.pauses[0][0] <= now:
            _, pause = self.pauses.pop(0)
            for state in self.ranks:
                if not state.blocked:
                    state.t += round(pause * (1 + abs(self.rng.gauss(0, 0.01))))

    def _stall(self, rank: int, state: _Rank) -> None:
        """The first stage reads the batch: now and then its data loader keeps a rank waiting."""
        chance = self.shape.loader_stall
        if chance and self.roles[rank].stage == 0 and self.rng.random() < chance:
            state.t += round(self.rng.uniform(*LOADER_STALL_MS) * 1e6)

    def _factor(self, rank: int, t: int) -> float:
        factor = self.speed[rank] * self._common * self.effects.slow_factor(rank, t)
        for start, end, slow in self.slowdowns:
            if start <= t < end:
                factor *= slow
        return factor

    def _drain(self, runnable: list[int]) -> None:
        """Run ranks until every one has finished its program or waits for others."""
        ranks = self.ranks
        stop = self.effects.stop_ns
        gauss, random = self.rng.gauss, self.rng.random
        jitter = self.job.spec.jitter
        while runnable:
            rank = runnable.pop()
            state = ranks[rank]
            if state.waiting or state.blocked:
                continue
            program = state.program
            while state.pc < len(program) and not state.blocked:
                step = program[state.pc]
                if isinstance(step, Compute):
                    duration = step.base_ns * self._factor(rank, state.t)
                    duration *= math.exp(gauss(0, jitter))
                    if random() < HICCUP_CHANCE:
                        duration *= 1 + random() * 0.15
                    state.t += int(duration)
                    state.pc += 1
                    continue
                enter = state.t + LAUNCH_NS
                if rank in stop and enter > stop[rank]:
                    state.blocked = True  # the GPU or process is gone: it never enters
                    break
                state.pc += 1
                done = self._enter(step, rank, enter)
                if done is None:
                    state.waiting = True
                    break
                runnable.extend(m for m in done if m != rank)

    def _enter(self, step: Operation, rank: int, enter: int) -> list[int] | None:
        """Enter an operation; the members it released when it was the last to enter."""
        c = step.comm
        member = self.index_of[c][rank]
        seq = self.issued[c][member]
        self.issued[c][member] += 1
        size = len(self.comms[c].members)
        pending = self.pending[c].get(seq)
        if pending is None:
            pending = _Pending(step.op, step.nbytes, step.member_bytes, [None] * size)
            self.pending[c][seq] = pending
        pending.enter[member] = enter
        pending.count += 1
        if pending.count < size:
            return None
        del self.pending[c][seq]
        return self._complete(c, seq, pending)

    def _complete(self, c: int, seq: int, pending: _Pending) -> list[int]:
        comm = self.comms[c]
        size = len(comm.members)
        enters = [e for e in pending.enter if e is not None]
        start = max(enters)
        op = pending.op
        if op == "allreduce":
            conn_bytes, steps = 2 * (size - 1) * pending.nbytes // size, 2 * (size - 1)
        elif op in ("send", "recv"):
            conn_bytes, steps = pending.nbytes, 1
        else:
            conn_bytes, steps = (size - 1) * pending.nbytes // size, size - 1
        bits: float = conn_bytes * 8
        rng = self.rng
        speeds = None
        if comm.ring is None:
            slowest, step_ns = NVLINK_GBPS, NVLINK_STEP_NS
        else:
            bandwidth = self.effects.bandwidth[comm.id]
            epoch = bandwidth.epoch(start)
            slowest, step_ns = bandwidth.slowest[epoch], RDMA_STEP_NS
            speeds = bandwidth.conn_gbps[epoch]
        pairs = comm.pairs if op == "alltoall" else None
        if pairs is not None:
            # All pairs at once: each carries 1/size of a member's buffer, at its own rate;
            # a member's sending takes as long as its slowest pair (`Comm.pairs`).
            paired = self.effects.pair_bandwidth[comm.id]
            rates = paired.conn_gbps[paired.epoch(start)]
            pair_bits = bits / (size - 1)
            sending = [0.0] * size
            for conn, gbps in zip(pairs, rates, strict=True):
                sending[conn.src] = max(sending[conn.src], pair_bits / gbps)
            bits, slowest = pair_bits, pair_bits / max(sending)
            speeds = tuple(bits / t if t else NVLINK_GBPS for t in sending)
        transfer = int(steps * step_ns + bits / slowest * math.exp(rng.gauss(0, TRANSFER_SIGMA)))
        done = start + transfer
        members = comm.members
        breakage = self.effects.broken.get(comm.id)
        enter = list(pending.enter)
        if breakage is not None and done > breakage.since_ns:
            for m in members:
                self.ranks[m].blocked = True
            run = OpRun(seq, op, pending.nbytes, enter, None, 0, None, breakage)
            self._record(c, seq, run, pending.member_bytes)
            return []
        random = rng.random
        ends = [done + int(random() * END_SKEW_NS) for _ in range(size)]
        busy = None
        carried = 0
        if speeds is not None:
            carried = conn_bytes
            gauss = rng.gauss
            busy = [
                max(1, min(transfer, int(bits / gbps * (1 + abs(gauss(0, 0.01))))))
                for gbps in speeds
            ]
        released = []
        for m, end in zip(members, ends, strict=True):
            state = self.ranks[m]
            state.t = end
            if state.waiting:
                state.waiting = False
                released.append(m)
        run = OpRun(seq, op, pending.nbytes, enter, ends, carried, busy)
        self._record(c, seq, run, pending.member_bytes)
        return released

    def _record(self, c: int, seq: int, run: OpRun, member_bytes: tuple[int, ...] | None) -> None:
        """Keep runs in seq order: an operation may complete before an earlier one did."""
        if member_bytes is not None:
            run.member_bytes = list(member_bytes)
        runs = self.result.runs[self.comms[c].id]
        held = self.open[c]
        held[seq] = run
        while len(runs) in held:
            runs.append(held.pop(len(runs)))

    def _flush_open(self) -> None:
        """Operations still waiting for members at the end: they never complete."""
        for c, pending in enumerate(self.pending):
            for seq, state in sorted(pending.items()):
                self._record(
                    c,
                    seq,
                    OpRun(seq, state.op, state.nbytes, list(state.enter), None, 0, None),
                    state.member_bytes,
                )
            runs = self.result.runs[self.comms[c].id]
            held = self.open[c]
            # Gaps (an operation nobody entered) end the record: nothing after it happened.
            while len(runs) in held:
                runs.append(held.pop(len(runs)))
