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

A line's event time is read off it for the barrier (the largest ``ts_ns`` in it); the
clock moves only by the reports the workers took (a line they reject moves nothing).
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from typing import IO, Any

from schemas.base import C4Model
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.messages import Collective, Collectives, Diagnosis, Job, Member, Route
from schemas.records import Rejected, decode_record
from streams.core.comm import NOT_YET
from streams.core.engine import Engine
from streams.core.split import (
    JobShare,
    NodeStage,
    part_of_row,
    part_row,
    report_of_row,
    report_row,
)
from streams.core.spread import apply_barrier, node_stage_of
from streams.replay import ReplayStats

_KIND = re.compile(rb'"kind"\s*:\s*"([a-z_]*)"')
_NODE = re.compile(rb'"node"\s*:\s*"([^"\\]*)"')
_JOB = re.compile(rb'"job"\s*:\s*"([^"\\]*)"')
_TS = re.compile(rb'"ts_ns"\s*:\s*(\d{1,19})\b')
COLLECTIVE_KINDS = (b"collective", b"collectives")
CHUNK_LINES = 512  # lines a worker gets at once: one pickle and pipe write, not one a line
BARRIER = "barrier"
LINES = "lines"
MESSAGES = "messages"
STOP = "stop"


def route(line: bytes) -> tuple[str, int] | None:
    """A collective line's routing key (its first node, else its job) and the largest
    ``ts_ns`` in it; None for any other line (or one without a key: decoded here)."""
    kind = _KIND.search(line)
    if kind is None or kind.group(1) not in COLLECTIVE_KINDS:
        return None
    key = _NODE.search(line) or _JOB.search(line)
    if key is None:
        return None
    latest = max((int(ts) for ts in _TS.findall(line)), default=NOT_YET)
    return key.group(1).decode("utf-8", "replace"), latest


def node_worker(conn: Connection) -> None:
    """A worker: the node stage of the lines it is sent, handed on at each barrier."""
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
                        stage.on_message(result)
                    else:  # routed here by its text, not a report after all: not taken
                        rejections.append(f"line {number}: not a collective report")
        elif kind == MESSAGES:
            for message in payload:
                taken += 1
                stage.on_message(message)
        elif kind == BARRIER:
            shares, latest = stage.barrier()
            conn.send((_share_rows(shares), latest, rejections, taken))
            rejections, taken = [], 0
        else:
            conn.close()
            return


def _share_rows(shares: list[JobShare]) -> list[tuple[Any, ...]]:
    return [
        (
            share.job,
            [report_row(report) for report in share.reports],
            [part_row(part) for part in share.parts],
            [part_row(part) for part in share.opens],
            share.finished,
            share.agents,
        )
        for share in shares
    ]


def _shares_of(rows: list[tuple[Any, ...]]) -> list[JobShare]:
    return [
        JobShare(
            job,
            tuple(report_of_row(row) for row in reports),
            tuple(part_of_row(row) for row in parts),
            tuple(part_of_row(row) for row in opens),
            tuple(finished),
            tuple(agents),
        )
        for job, reports, parts, opens, finished, agents in rows
    ]


class SpreadReplay:
    """The job stage here, the node stages in ``workers`` processes (started here, stopped
    by `close` or at the end of `run`)."""

    def __init__(self, engine: Engine, workers: int) -> None:
        if workers < 1:
            message = f"workers must be at least 1, not {workers}"
            raise ValueError(message)
        self.engine = engine
        context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self._conns: list[Connection] = []
        self._processes = []
        for _ in range(workers):
            here, there = context.Pipe()
            process = context.Process(target=node_worker, args=(there,), daemon=True)
            process.start()
            there.close()
            self._conns.append(here)
            self._processes.append(process)
        self._chunks: list[list[tuple[int, bytes]]] = [[] for _ in range(workers)]

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """Feed one decoded message (placements loaded before the replay, or a report this
        process decoded): a report to its node's worker, anything else to the job stage."""
        if isinstance(message, Collective | Collectives):
            node = message.node or message.job
            self._send(node_stage_of(node, len(self._conns)), MESSAGES, [message])
            return []
        out = self.barrier(None) if isinstance(message, Job | Member | Route) else []
        out.extend(self.engine.on_message(message))
        return out

    def on_eof(self) -> list[Diagnosis]:
        """The input ended: the last barrier, the job stage's last judgement."""
        found = self.barrier(None)
        return found + self.engine.on_eof()

    def _send(self, worker: int, kind: str, payload: object) -> None:
        self._flush(worker)
        self._conns[worker].send((kind, payload))

    def _flush(self, worker: int) -> None:
        chunk = self._chunks[worker]
        if chunk:
            self._conns[worker].send((LINES, chunk))
            self._chunks[worker] = []

    def barrier(self, stats: ReplayStats | None, errors: IO[str] | None = None) -> list[Diagnosis]:
        """Every worker hands on what it took; the job stage takes it all."""
        for worker, conn in enumerate(self._conns):
            self._flush(worker)
            conn.send((BARRIER, None))
        shares: list[JobShare] = []
        latest = NOT_YET
        for conn in self._conns:
            rows, until, rejections, taken = conn.recv()
            shares.extend(_shares_of(rows))
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
        engine = self.engine
        workers = len(self._conns)
        try:
            for number, raw in lines:
                if raw is None:
                    stats.rejected += 1
                    if errors is not None:
                        errors.write(
                            f"line {number}: line over {MAX_MESSAGE_BYTES} bytes (skipped)\n"
                        )
                    continue
                line = raw.strip()
                if not line:
                    continue
                routed = route(line)
                if routed is not None:
                    node, ts_ns = routed
                    worker = node_stage_of(node, workers)
                    chunk = self._chunks[worker]
                    chunk.append((number, line))
                    if len(chunk) >= CHUNK_LINES:
                        self._flush(worker)
                    if engine.clock.due(ts_ns):
                        yield from self.barrier(stats, errors)
                    continue
                for result in decode_record(line):
                    if isinstance(result, Rejected):
                        stats.rejected += 1
                        if errors is not None:
                            errors.write(f"line {number}: {result.reason}\n")
                        continue
                    stats.messages += 1
                    if isinstance(result, Collective | Collectives):
                        self.on_message(result)  # a report the text did not show: its worker
                        continue
                    if isinstance(result, Job | Member | Route):
                        yield from self.barrier(stats, errors)
                    yield from engine.on_message(result)
            yield from self.barrier(stats, errors)
            yield from engine.on_eof()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        for conn in self._conns:
            try:
                conn.send((STOP, None))
                conn.close()
            except OSError:
                pass  # gone already
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
        self._conns, self._processes = [], []
