"""``c4 diagnose --workers N``: the node stages in N worker processes, the job stage here.

The reading process routes each line without decoding it: a collective report or a
node's batch of them (its first ``kind``) goes, by its first ``node`` (else its ``job``),
to one worker, which decodes, validates and takes it (`streams.core.split.NodeStage`);
every other line is decoded here, for the job stage (the `Engine`). The lines go to the
workers in chunks while the reading goes on, so the workers decode and take reports while
this process judges. At each barrier (`streams.core.spread`: before a periodic check, a
fact about a job, the end) every worker hands on what it took, as plain rows, and the job
stage takes it in its own order: the same findings as one process with as many node
stages, whatever the number of workers.

A collective line's event time is read off it for the barriers (the largest ``ts_ns``
in it, what `streams.core.split.event_time` gives of it once decoded: a line the worker
then rejects still counted for when the stages meet); the job stage's clock moves only by
the reports the workers took. The reading runs ahead of the job stage by up to
``AHEAD_BARRIERS`` barriers (the lines it reads meanwhile wait here, decoded), so the
workers take the next reports while the job stage judges the last ones; each worker is sent
its lines by a thread of its own, so neither side waits on a full pipe while the other
waits on it.
"""

from __future__ import annotations

import gc
import multiprocessing
import queue
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from typing import IO

from schemas.base import C4Model
from schemas.messages import Collective, Collectives, Diagnosis, Job, Member, Route
from schemas.records import Rejected, decode_record
from streams.core.clock import TickClock
from streams.core.comm import NOT_YET
from streams.core.engine import Engine
from streams.core.relay import route
from streams.core.split import (
    JobShare,
    NodeStage,
    event_time,
    share_of_row,
    share_row,
)
from streams.core.spread import apply_barrier, hardware_time, node_stage_of
from streams.replay import ReplayStats, decoded, kept_lines

CHUNK_LINES = 512  # lines a worker gets at once: one pickle and pipe write, not one a line
AHEAD_BARRIERS = 2  # barriers the reading may be ahead of the job stage
BARRIER = "barrier"
LINES = "lines"
MESSAGES = "messages"
FORGET = "forget"
RUN = "run"
STOP = "stop"


def node_worker(conn: Connection) -> None:
    """A worker: the node stage of the lines it is sent, handed on at each barrier. Without
    the cyclic collector, as the replay it serves (`c4.gc_tuning.no_collections`): the
    process ends with the replay."""
    gc.freeze()
    gc.disable()
    stage = NodeStage()
    rejections: list[str] = []
    taken = 0
    while True:
        kind, payload = conn.recv()
        if kind == LINES:
            for number, line in payload:
                for result in decode_record(line):
                    if isinstance(result, Rejected):
                        rejections.append(f"line {number}: {result.reason}")
                    elif isinstance(result, Collective | Collectives):
                        taken += 1
                        stage.on_message(result, number)
                    else:  # its first "kind" said collective, its own kind does not
                        rejections.append(
                            f"line {number}: a {type(result).__name__.lower()} message whose"
                            ' first "kind" field reads "collective": ambiguous, skipped'
                        )
        elif kind == MESSAGES:  # decoded (and counted) by the reading process
            for number, message in payload:
                stage.on_message(message, number)
        elif kind == FORGET:
            stage.forget(str(payload))
        elif kind == RUN:
            job, restart = payload
            stage.on_run(job, restart)
        elif kind == BARRIER:
            shares, latest = stage.barrier()
            conn.send(([share_row(share) for share in shares], latest, rejections, taken))
            rejections, taken = [], 0
        else:
            conn.close()
            return


class SpreadReplay:
    """The job stage here, the node stages in ``workers`` processes (started here, stopped
    by `close` or at the end of `run`)."""

    def __init__(self, engine: Engine, workers: int) -> None:
        if workers < 1:
            message = f"workers must be at least 1, not {workers}"
            raise ValueError(message)
        self.engine = engine
        self.meeting = TickClock(engine.params.tick_ns)  # when the stages meet (`spread`)
        context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self._conns: list[Connection] = []
        self._processes = []
        self._outboxes: list[queue.SimpleQueue[tuple[str, object] | None]] = []
        self._senders: list[threading.Thread] = []
        for index in range(workers):
            here, there = context.Pipe()
            process = context.Process(target=node_worker, args=(there,), daemon=True)
            process.start()
            there.close()
            outbox: queue.SimpleQueue[tuple[str, object] | None] = queue.SimpleQueue()
            sender = threading.Thread(
                target=_send_all, args=(here, outbox), name=f"c4-node-stage-{index}", daemon=True
            )
            sender.start()
            self._conns.append(here)
            self._processes.append(process)
            self._outboxes.append(outbox)
            self._senders.append(sender)
        self._chunks: list[list[tuple[int, bytes]]] = [[] for _ in range(workers)]
        # What the job stage has yet to take, in input order: decoded messages, and None
        # for a barrier the workers were asked for.
        self._waiting: deque[C4Model | None] = deque()
        self._barriers_waiting = 0
        self._stats: ReplayStats | None = None
        self._errors: IO[str] | None = None

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """Feed one decoded message before the replay (the placements of ``--jobs``)."""
        self._take(message)
        return self._drain(0)

    def on_eof(self) -> list[Diagnosis]:
        """The input ended: the last barrier, the job stage's last judgement."""
        self._ask_barrier()
        found = self._drain(0)
        return found + self.engine.on_eof()

    def _send(self, worker: int, kind: str, payload: object) -> None:
        self._flush(worker)
        self._outboxes[worker].put((kind, payload))

    def _flush(self, worker: int) -> None:
        chunk = self._chunks[worker]
        if chunk:
            self._outboxes[worker].put((LINES, chunk))
            self._chunks[worker] = []

    def _ask_barrier(self) -> None:
        """Ask every worker to hand on what it took so far (answered in order)."""
        for worker in range(len(self._conns)):
            self._send(worker, BARRIER, None)
        self._waiting.append(None)
        self._barriers_waiting += 1

    def _take(self, message: C4Model, number: int = 0) -> None:
        """A decoded message: a report to its worker, anything else to wait for the job
        stage behind the barriers asked before it."""
        if isinstance(message, Collective | Collectives):
            node = message.node or message.job
            self._send(node_stage_of(node, len(self._conns)), MESSAGES, [(number, message)])
            if self.meeting.advance(event_time(message)):
                self._ask_barrier()
            return
        hardware_ns = hardware_time(message)
        if isinstance(message, Job | Member | Route) or (
            hardware_ns is not None and self.meeting.advance(hardware_ns)
        ):
            self._ask_barrier()
        if isinstance(message, Job) and message.state == "stopped":
            for worker in range(len(self._conns)):
                self._send(worker, FORGET, message.job)  # after the barrier asked above
        if isinstance(message, Member):
            for worker in range(len(self._conns)):
                self._send(worker, RUN, (message.job, message.restart))
        self._waiting.append(message)

    def _drain(self, ahead: int) -> list[Diagnosis]:
        """Let the job stage take what waits, until only ``ahead`` barriers are ahead."""
        out: list[Diagnosis] = []
        waiting = self._waiting
        while waiting:
            item = waiting[0]
            if item is None:
                if self._barriers_waiting <= ahead:
                    break
                waiting.popleft()
                self._barriers_waiting -= 1
                out.extend(self._barrier())
            else:
                waiting.popleft()
                out.extend(self.engine.on_message(item))
        return out

    def _barrier(self) -> list[Diagnosis]:
        """Every worker's answer to one barrier; the job stage takes it all. Without the
        cyclic collector meanwhile (`c4 diagnose` runs without it throughout): a barrier's
        rows are thousands of tuples alive at once, freed by their counts right after, and a
        collection among them walked them all (a sixth of this process's time on a
        4,096-rank job)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._take_barrier()
        finally:
            if enabled:
                gc.enable()

    def _take_barrier(self) -> list[Diagnosis]:
        shares: list[JobShare] = []
        stats, errors = self._stats, self._errors
        latest = NOT_YET
        for conn in self._conns:
            rows, until, rejections, taken = conn.recv()
            shares.extend(share_of_row(row) for row in rows)
            latest = max(latest, until)
            if stats is not None:
                stats.messages += taken
                stats.rejected += len(rejections)
            if errors is not None:
                for rejection in rejections:
                    errors.write(rejection + "\n")
        return apply_barrier(self.engine, shares, latest)

    def run(
        self,
        lines: Iterable[tuple[int, bytes | None]],
        stats: ReplayStats,
        errors: IO[str] | None = None,
    ) -> Iterator[Diagnosis]:
        """Replay numbered lines (`streams.replay.replay`'s input); yield the diagnoses as
        they change, the job stage's last judgement at the end."""
        self._stats, self._errors = stats, errors
        workers = len(self._conns)
        meeting = self.meeting
        try:
            for number, line in kept_lines(lines, stats, errors):
                routed = route(line)
                if routed is not None:
                    node, ts_ns = routed
                    worker = node_stage_of(node, workers)
                    chunk = self._chunks[worker]
                    chunk.append((number, line))
                    if len(chunk) >= CHUNK_LINES:
                        self._flush(worker)
                    if ts_ns != NOT_YET and meeting.advance(ts_ns):
                        self._ask_barrier()
                else:
                    for message in decoded(number, line, stats, errors):
                        self._take(message, number)
                if self._barriers_waiting > AHEAD_BARRIERS:
                    yield from self._drain(AHEAD_BARRIERS)
            yield from self.on_eof()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        for outbox in self._outboxes:
            outbox.put((STOP, None))
            outbox.put(None)
        for sender in self._senders:
            sender.join(timeout=5)
        for conn in self._conns:
            conn.close()
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
        self._conns, self._processes, self._outboxes, self._senders = [], [], [], []


def _send_all(conn: Connection, outbox: queue.SimpleQueue[tuple[str, object] | None]) -> None:
    """A worker's sender: what the outbox holds, in order, until None."""
    while (item := outbox.get()) is not None:
        try:
            conn.send(item)
        except OSError:
            return  # the worker is gone: the replay fails on its next answer
