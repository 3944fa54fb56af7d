"""bench_load's load: 256-rank jobs whose ranks report once a second, with scripted faults.

Messages are encoded on the fly from pre-encoded pieces (per rank: its header; per job and
second: the operation arrays); `replay_check` runs every fault kind through the detectors
offline, to show that the generator itself is sound.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
from bench_streams import MS, OPS_PER_MESSAGE, RANKS, S

from schemas.codec import decode
from schemas.messages import Collective, Diagnosis
from streams.core.engine import Engine
from streams.core.places import gpu_id

KINDS = ("noncomm_hang", "noncomm_slow", "comm_hang", "node_down")
HANGS = ("noncomm_hang", "comm_hang", "node_down")
PERIOD_NS = S // OPS_PER_MESSAGE
OP_NS = 2 * MS  # an operation's transfer time
JITTER_NS = 300_000  # healthy ranks enter within this of each other
STRAGGLER_LAG_NS = 1_500_000
GPUS_PER_NODE = 8
VARIANTS = 8  # jitter patterns per job and second (ranks take them in turn)
EMPTY_OPS = orjson.dumps({"seq": [], "op": [], "bytes": [], "enter_ns": [], "end_ns": []})


@dataclass(frozen=True)
class Fault:
    """Fault ``number`` of kind ``kind`` in job ``job`` from ``onset_s`` to ``recover_s``."""

    number: int
    kind: str
    job: str
    onset_s: int  # seconds of the run: the reporting interval it starts in
    recover_s: int
    rank: int  # the culprit rank (node_down: a rank of the culprit node)

    def culprits(self) -> range:
        if self.kind == "node_down":
            first = self.rank // GPUS_PER_NODE * GPUS_PER_NODE
            return range(first, first + GPUS_PER_NODE)
        if self.kind == "comm_hang":
            return range(0)
        return range(self.rank, self.rank + 1)

    def expected_suspect(self) -> str | None:
        node = node_name(self.job, self.rank)
        if self.kind == "node_down":
            return node
        if self.kind == "comm_hang":
            return None  # no connection samples here: the finding names no culprit
        return gpu_id(node, self.rank % GPUS_PER_NODE)


def node_name(job: str, rank: int) -> str:
    return f"{job}-node-{rank // GPUS_PER_NODE:02d}"


def ops_json(seqs: list[int], enters: list[int], ends: list[int | None]) -> bytes:
    n = len(seqs)
    return orjson.dumps(
        {
            "seq": seqs,
            "op": ["allreduce"] * n,
            "bytes": [1 << 24] * n,
            "enter_ns": enters,
            "end_ns": ends,
        }
    )


class JobSim:
    """One 256-rank job: its ranks' reports, second after second, faults included."""

    def __init__(self, index: int, jitter: list[list[int]], phase_ns: int = 0) -> None:
        self.name = f"load-{index:03d}"
        self.phase_ns = phase_ns  # its reporting intervals start this far into each second
        self.key = self.name.encode()
        self.heads = [
            orjson.dumps(
                {
                    "v": 1,
                    "kind": "collective",
                    "job": self.name,
                    "comm": f"{self.name}-dp",
                    "comm_size": RANKS,
                    "rank": rank,
                    "global_rank": rank,
                    "node": node_name(self.name, rank),
                    "gpu": rank % GPUS_PER_NODE,
                }
            )[:-1]
            + b',"ops":'
            for rank in range(RANKS)
        ]
        self.jitter = jitter
        self.next_seq = 0
        self.fault: Fault | None = None
        self.hung = False  # every rank waits in operation next_seq (entered or not)

    def reports(self, second: int, start_ns: int, rng: random.Random) -> Iterator[bytes]:
        """The messages of reporting interval ``second`` (starting at ``start_ns``)."""
        default, special = self._plan(second, start_ns, rng)
        tail = b',"ts_ns":%d}' % (start_ns + S)
        shift = rng.randrange(VARIANTS)
        for rank, head in enumerate(self.heads):
            ops = special.get(rank, default[(rank + shift) % VARIANTS])
            if ops is not None:
                yield head + ops + tail

    def _plan(
        self, second: int, start_ns: int, rng: random.Random
    ) -> tuple[list[bytes], dict[int, bytes | None]]:
        """Operation arrays of most ranks (jitter variants) and of the exceptions (None: silent)."""
        fault = self.fault
        if fault is not None and second >= fault.recover_s and fault.kind not in HANGS:
            self.fault = fault = None
        silent: dict[int, bytes | None] = {}  # None: the rank sends nothing
        if fault is not None and fault.kind == "node_down":
            silent = dict.fromkeys(fault.culprits())
        if self.hung and fault is not None and second < fault.recover_s:
            return [EMPTY_OPS] * VARIANTS, silent  # everyone waits: heartbeats
        if fault is not None and fault.kind in HANGS and second == fault.onset_s:
            self.hung = True
            enters = [[start_ns + row[0]] for row in self.jitter[:VARIANTS]]
            default = [ops_json([self.next_seq], enter, [None]) for enter in enters]
            if fault.kind != "node_down":
                silent = dict.fromkeys(fault.culprits(), EMPTY_OPS)
            return default, silent
        seqs = list(range(self.next_seq, self.next_seq + OPS_PER_MESSAGE))
        starts = [start_ns + i * PERIOD_NS for i in range(OPS_PER_MESSAGE)]
        ends: list[int | None] = [start + OP_NS for start in starts]
        special: dict[int, bytes | None] = {}
        if self.hung and fault is not None:
            # Recovery: the hung operation (seqs[0]) ends now; the culprits enter it only now.
            culprit_enters = [start + rng.randrange(JITTER_NS) for start in starts]
            special = dict.fromkeys(fault.culprits(), ops_json(seqs, culprit_enters, ends))
            self.hung = False
            self.fault = None
        elif fault is not None and fault.kind == "noncomm_slow" and second >= fault.onset_s:
            late = [start + STRAGGLER_LAG_NS + rng.randrange(100_000) for start in starts]
            special = {fault.rank: ops_json(seqs, late, ends)}
        self.next_seq = seqs[-1] + 1
        variants = rng.sample(range(len(self.jitter)), VARIANTS)
        default = [
            ops_json(seqs, [s + j for s, j in zip(starts, self.jitter[v], strict=True)], ends)
            for v in variants
        ]
        return default, special


def schedule(jobs: int, duration_s: int, every_s: int, fault_s: int) -> list[Fault]:
    """A fault every ``every_s`` from ``every_s / 2`` on, each in the next job, kinds in turn."""
    faults: list[Fault] = []
    onset = every_s // 2
    while onset < duration_s - 10:
        number = len(faults)
        job = f"load-{number % jobs:03d}"
        rank = (1 + 37 * number) % RANKS
        kind = KINDS[number % len(KINDS)]
        faults.append(Fault(number + 1, kind, job, onset, onset + fault_s, rank))
        onset += every_s
    return faults


def replay_check(fault_s: int) -> int:
    """Every fault kind in one job, through the detectors offline: the generator is sound."""
    rng = random.Random(5)
    jitter = [[rng.randrange(JITTER_NS) for _ in range(OPS_PER_MESSAGE)] for _ in range(32)]
    every = fault_s + 10
    faults = [
        Fault(i + 1, kind, "load-000", 5 + i * every, 5 + i * every + fault_s, 1 + 37 * i)
        for i, kind in enumerate(KINDS)
    ]
    sim = JobSim(0, jitter)
    engine = Engine()
    t0 = 1_733_130_000 * S
    found: list[tuple[int, Diagnosis]] = []
    for second in range(5 + len(KINDS) * every):
        for fault in faults:
            if fault.onset_s == second:
                sim.fault = fault
        for value in sim.reports(second, t0 + second * S, rng):
            message = decode(value)
            if not isinstance(message, Collective):
                print(f"generator wrote a bad message: {message}", file=sys.stderr)
                return 1
            found.extend((second, d) for d in engine.process(message))
    for second, d in found:
        top = d.suspects[0].id if d.suspects else "-"
        print(f"second {second:3d}: {d.class_:<13} {d.state:<8} suspect {top}")
    for fault in faults:
        hits = [d for _, d in found if d.class_ == fault.kind and d.state == "firing"]
        print(f"{fault.kind}: {'found' if hits else 'MISSED'}")
    return 0
