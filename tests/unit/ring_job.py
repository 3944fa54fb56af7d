"""A tiny ring-allreduce job for table-driven detector tests (the simulator is bigger)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from schemas.messages import Collective, Conns, Job, Ops, RankPlace

S = 1_000_000_000
MS = 1_000_000
T0 = 1_733_130_000 * S


@dataclass
class RingJob:
    """n ranks, 8 per node; per op: compute, then a ring allreduce paced by its slowest link."""

    n: int = 16
    ops: int = 120
    compute_ns: int = 200 * MS
    transfer_ns: int = 20 * MS
    jitter: float = 0.01
    seed: int = 1
    slow_rank: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank: (from op, x)
    stuck_rank: dict[int, int] = field(default_factory=dict)  # rank: op it never enters
    dead_node: dict[int, int] = field(default_factory=dict)  # node index: from op
    slow_port: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank: (op, bw share)
    slow_until: int | None = None  # op from which the slow ranks are fast again
    pause: tuple[int, int] | None = None  # (before op, pause ns): a job-wide checkpoint
    stall_at: int | None = None  # op every rank enters and none finishes (a dead link)
    slow_conn: dict[int, tuple[int, float]] = field(default_factory=dict)  # r->r+1: (op, share)
    slow_conn_until: dict[int, int] = field(default_factory=dict)  # r->r+1: op fast again
    first_node: int = 0
    job: str = "job-1"
    comm: str = "c0"

    def place(self, rank: int) -> tuple[str, int, str]:
        node = f"node-{self.first_node + rank // 8:03d}"
        return node, rank % 8, f"mlx5_{rank % 8}:1"

    def job_message(self) -> Job:
        ranks = tuple(
            RankPlace(rank=r, node=self.place(r)[0], gpu=self.place(r)[1], port=self.place(r)[2])
            for r in range(self.n)
        )
        return Job(
            v=1,
            kind="job",
            job=self.job,
            ts_ns=T0,
            state="running",
            ranks=ranks,
            comms={self.comm: tuple(range(self.n))},
        )

    def messages(self) -> list[Collective]:
        rng = random.Random(self.seed)  # noqa: S311 - test data
        # per rank: list of (seq, enter, end or None); end None = never finishes
        records: dict[int, list[tuple[int, int, int | None]]] = {r: [] for r in range(self.n)}
        conn_records: dict[int, list[tuple[int, int, int]]] = {r: [] for r in range(self.n)}
        gone_at: dict[int, int] = {}
        t = T0
        hung = False
        for op in range(self.ops):
            if self.pause and op == self.pause[0]:
                t += self.pause[1]
            enters = {}
            for r in range(self.n):
                if self.dead_node.get(r // 8, self.ops + 1) <= op:
                    gone_at.setdefault(r, t)
                    continue
                factor = 1.0
                recovered = self.slow_until is not None and op >= self.slow_until
                if r in self.slow_rank and op >= self.slow_rank[r][0] and not recovered:
                    factor = self.slow_rank[r][1]
                if self.stuck_rank.get(r, self.ops + 1) <= op:
                    continue
                enters[r] = t + int(self.compute_ns * factor * (1 + rng.gauss(0, self.jitter)))
            shares = [bw for r, (start, bw) in self.slow_port.items() if op >= start]
            slow_conns = {
                r
                for r, (start, _) in self.slow_conn.items()
                if start <= op < self.slow_conn_until.get(r, self.ops + 1)
            }
            shares += [bw for r, (_, bw) in self.slow_conn.items() if r in slow_conns]
            share = min(shares or [1.0])
            transfer = int(self.transfer_ns / share * (1 + rng.gauss(0, self.jitter / 2)))
            complete = len(enters) == self.n and op != self.stall_at
            end = max(enters.values()) + transfer if enters else t
            for r, enter in enters.items():
                records[r].append((op, enter, end if complete else None))
                if complete:
                    degraded = {p for p, (start, _) in self.slow_port.items() if op >= start}
                    slow = r in degraded or (r + 1) % self.n in degraded or r in slow_conns
                    busy = int(transfer if slow else self.transfer_ns)
                    conn_records[r].append((end, 64 * MS, busy))
            if not complete:
                hung = True
                break
            t = end
        horizon = t + 30 * S if hung else t + 2 * S
        return self._report(records, conn_records, gone_at, horizon)

    def _report(
        self,
        records: dict[int, list[tuple[int, int, int | None]]],
        conn_records: dict[int, list[tuple[int, int, int]]],
        gone_at: dict[int, int],
        horizon: int,
    ) -> list[Collective]:
        out: list[Collective] = []
        for r in range(self.n):
            node, gpu, port = self.place(r)
            reported_done: set[int] = set()
            ts = T0 + S
            while ts <= horizon and ts <= gone_at.get(r, horizon):
                seqs, ends, enters, done = [], [], [], []
                for seq, enter, end in records[r]:
                    if enter > ts or seq in reported_done:
                        continue
                    finished = end is not None and end <= ts
                    seqs.append(seq)
                    enters.append(enter)
                    ends.append(end if finished else None)
                    if finished:
                        done.append(seq)
                reported_done.update(done)
                window = [c for c in conn_records[r] if ts - S < c[0] <= ts]
                conns = (
                    Conns(
                        peer=tuple((r + 1) % self.n for _ in window),
                        port=tuple(port for _ in window),
                        bytes=tuple(c[1] for c in window),
                        busy_ns=tuple(c[2] for c in window),
                    )
                    if window
                    else None
                )
                out.append(
                    Collective(
                        v=1,
                        kind="collective",
                        job=self.job,
                        comm=self.comm,
                        comm_size=self.n,
                        rank=r,
                        global_rank=r,
                        node=node,
                        gpu=gpu,
                        ts_ns=ts,
                        ops=Ops(
                            seq=tuple(seqs),
                            op=tuple("allreduce" for _ in seqs),
                            bytes=tuple(64 * MS for _ in seqs),
                            enter_ns=tuple(enters),
                            end_ns=tuple(ends),
                        ),
                        conns=conns,
                    )
                )
                ts += S
        out.sort(key=lambda m: (m.ts_ns, m.rank))
        return out
