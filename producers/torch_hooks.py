"""PyTorch instrumentation: every collective and point-to-point operation, one call to start.

    from producers.torch_hooks import instrument
    from producers.torch_sinks import folder_sink
    instrument("job-42", sink=folder_sink("/run/c4/torch", "job-42.rank3"))

Hooks are registered on every process group (c10d's pre/post hooks, run by c10d itself,
so operations issued from C++ such as DDP's gradient buckets are seen too), on those that
exist and on every one created later. On the training thread the pre-hook records the op,
its bytes and the enter time; the post-hook hands the Work to whatever takes its end time.
For gloo that is a callback on the Work's future (exact); for NCCL and other backends,
whose future completes when the kernel is enqueued, a thread that polls
``Work.is_completed()`` (the CUDA events). The hooks and both ways run in C++
(`producers.torch_taps`: no GIL taken, no Python run on any call, polled every 500 µs);
where that helper cannot be built, in Python (each hook then takes the GIL back from c10d,
the callback takes it in the path ``wait()`` waits on, the poller asks every millisecond).
A Work without a future (gloo's reduce_scatter) is taken as finished at the latest when
the rank enters its next operation on that group: an upper bound of its end, the only one
such a Work gives (it does not say it completed before ``wait()`` is called). A background
thread turns the records into one v1 message per communicator per interval and hands the
batch to the sink.

The communicator id is the process group's global name (the same on all members, since all
members create groups in the same order); ``seq`` counts the group's operations on every
member alike. Point-to-point operations go to the pair's communicator
``<name>:p2p:<lo>-<hi>`` (global ranks) with a per-pair ``seq``. torch is imported only
here and in `producers.torch_groups` (c10d's op names, groups created later), and only when
`instrument` is called; the sinks are `producers.torch_sinks`.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from producers import ProducerError
from producers.oplog import END, CommLog, OpRecorder
from producers.torch_groups import hook_ops, stop_watching, watch_new_groups
from producers.torch_sinks import folder_sink, kafka_sink
from producers.torch_taps import NativeHooks, NativeUnavailable, Tap, load_native
from schemas.messages import Collective, OpName

__all__ = [
    "Completion",
    "InstrumentationError",
    "TorchInstrumentation",
    "folder_sink",
    "instrument",
    "kafka_sink",
]

Sink = Callable[[list[Collective]], None]
Completion = Literal["auto", "future", "poll"]
EndSignal = Literal["future", "poll"]  # what tells one process group's operations ended
NATIVE_POLL_S = 0.0005  # the C++ poller's period: no GIL taken, but each wake-up costs CPU
PYTHON_POLL_S = 0.001  # the Python poller's: it takes the GIL every time
HOOK_ID = 0x_C4  # the id our hooks are registered under on every process group


class InstrumentationError(ProducerError):
    """The training process cannot be instrumented (torch too old, no torch.distributed)."""


def _finished(record: list[object], _future: object) -> None:
    record[END] = time.time_ns()


@dataclass(slots=True)
class _Tapped:
    """A process group recorded by C++ hooks, and its records still waiting for an end."""

    tap: Tap
    name: str
    log: CommLog
    members: list[int]
    me: int
    pairs: dict[int, CommLog] = field(default_factory=dict)
    running: dict[int, list[object]] = field(default_factory=dict)  # tap id -> record
    errors: int = 0


class TorchInstrumentation:
    """The hooks of one training process and the thread that batches what they record."""

    def __init__(
        self,
        job: str,
        sink: Callable[[list[Collective]], None],
        interval_s: float = 1.0,
        node: str | None = None,
        gpu: int | None = None,
        completion: Completion = "auto",
        poll_s: float | None = None,
        native: bool | None = None,
        restart: int | None = None,
    ) -> None:
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d as c10d
        except ImportError as error:
            message = f"torch.distributed is not available ({error})"
            raise InstrumentationError(message) from error
        if not hasattr(dist.ProcessGroup, "register_pre_hook"):
            message = (
                f"torch {getattr(sys.modules.get('torch'), '__version__', '?')} has no "
                "ProcessGroup.register_pre_hook; c4's instrumentation needs a torch with "
                "process-group hooks"
            )
            raise InstrumentationError(message)
        self._dist, self._c10d = dist, c10d
        self.recorder = OpRecorder(job, node, gpu, restart)
        self._sink = sink
        self.interval_s = interval_s
        self._ops: dict[Any, OpName] = hook_ops()
        self._op_codes: dict[int, OpName] = {int(name): op for name, op in self._ops.items()}
        self._taps: list[_Tapped] = []
        self._attached: dict[str, Any] = {}
        self._unfinished: list[tuple[Any, list[object]]] = []  # Works without a future
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._stop = threading.Event()
        self._blind: list[list[list[object]]] = []
        self.sink_errors = 0
        self.hook_errors = 0
        self._hook_errors_reported = False
        self._thread = threading.Thread(target=self._loop, name="c4-instrumentation", daemon=True)
        self.completion = completion
        self._polled: deque[tuple[Any, list[object]]] = deque()  # Works the poller watches
        self._poller = threading.Thread(target=self._poll_loop, name="c4-completion", daemon=True)
        self.native: NativeHooks | None = None
        self.native_problem: str | None = None  # why the hooks run in Python
        if native is not False:
            try:
                self.native = load_native()
            except NativeUnavailable as error:
                if native:
                    raise InstrumentationError(str(error)) from error
                self.native_problem = str(error)
                print(f"c4 instrumentation: {error}; recording in Python", file=sys.stderr)
        self.poll_s = poll_s or (NATIVE_POLL_S if self.native else PYTHON_POLL_S)
        if self.native is not None:
            self.native.set_poll_period_us(max(1, round(self.poll_s * 1e6)))

    def start(self) -> TorchInstrumentation:
        """Hook every existing process group and every later one; start batching."""
        if self._dist.is_initialized():
            for group in list(self._c10d._world.pg_map):
                self.attach(group)
        watch_new_groups(self._c10d, self.attach)
        self._thread.start()
        return self

    def attach(self, group: Any, members: list[int] | None = None) -> None:
        """Register the hooks on one process group (once); ``members``: its global ranks."""
        dist = self._dist
        if not isinstance(group, dist.ProcessGroup):
            return
        name = str(group.group_name)
        with self._lock:
            if name in self._attached:
                return
            self._attached[name] = group
        if members is None:
            members = list(dist.get_process_group_ranks(group))
        if not members:  # the default group, while init_process_group creates it
            members = list(range(group.size()))
        me = members[group.rank()]
        log = self.recorder.comm(name, group.size(), group.rank(), me)
        signal = self._end_signal(group)
        if self.native is not None:
            codes = sorted(self._op_codes)
            tap = self.native.tap_group(group, HOOK_ID, codes, signal == "poll")
            with self._lock:
                self._taps.append(_Tapped(tap, name, log, members, me))
            return
        pre, post = self._hooks(name, log, members, me, signal)
        group.register_pre_hook(HOOK_ID, pre)
        group.register_post_hook(HOOK_ID, post)

    def detach(self) -> None:
        """Unregister the hooks from every process group (``attach`` may add them again)."""
        with self._lock:
            groups = list(self._attached.values())
            self._attached.clear()
        for group in groups:
            try:
                group.unregister_pre_hook(HOOK_ID)
                group.unregister_post_hook(HOOK_ID)
            except RuntimeError:
                pass  # the group was destroyed already

    def _end_signal(self, group: Any) -> EndSignal:
        """What tells this group's operations ended. Only a backend whose future completes
        when the operation has finished (gloo) can use its future; NCCL's completes at
        enqueue, which says nothing about when the GPU finished, so its Works are polled."""
        if self.completion != "auto":
            return self.completion
        try:
            backend = str(group._get_backend_name())
        except (AttributeError, RuntimeError):
            backend = "unknown"
        return "future" if backend == "gloo" else "poll"

    def _hooks(
        self, name: str, log: CommLog, members: list[int], me: int, signal: EndSignal = "future"
    ) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
        ops, recorder, clock = self._ops, self.recorder, time.time_ns
        pending: dict[int, list[object]] = {}
        pairs: dict[int, CommLog] = {}
        unfinished = self._unfinished
        polled = self._polled
        polls = signal == "poll"
        if polls and not self._poller.is_alive() and not self._stop.is_set():
            self._poller.start()
        blind: list[list[object]] = []  # records whose Work has no future (gloo reduce_scatter)
        self._blind.append(blind)
        with_future: set[Any] = set()  # op kinds whose Works have a future on this group

        def blind_end(work: Any, record: list[object]) -> None:
            """A Work without a future (gloo's reduce_scatter), which does not say it
            completed before ``wait()`` either: polled, and its end bounded by the rank's
            next operation on this group."""
            unfinished.append((work, record))
            blind.append(record)

        def pre(args: Any) -> None:
            try:
                op = ops.get(args.name)
                if op is None:
                    return
                if blind:  # the rank went on to its next operation: those finished by now
                    now = clock()
                    for earlier in blind:
                        if earlier[END] is None:
                            earlier[END] = now
                    blind.clear()
                target = log
                if op == "send" or op == "recv":
                    peer = members[args.root]
                    target = pairs.get(peer) or _pair(recorder, pairs, name, me, peer)
                nbytes = 0
                for tensor in args.input_tensors or args.output_tensors:
                    nbytes += tensor.nbytes
                pending[args.op_id] = target.enter(op, nbytes, clock())
            except Exception:  # noqa: BLE001 -- a hook must never break the training step
                self.hook_errors += 1

        def post(args: Any) -> None:
            try:
                record = pending.pop(args.op_id, None)
                if record is None:
                    return
                work = args.work
                if work is None:  # c10d gives none for an operation it completed in the call
                    record[END] = clock()
                    return
                if polls and args.name not in with_future:  # once per op kind and group
                    try:
                        work.get_future()
                    except RuntimeError:
                        blind_end(work, record)
                        return
                    with_future.add(args.name)
                if polls:
                    polled.append((work, record))  # the common case: one append
                else:
                    try:
                        future = work.get_future()
                    except RuntimeError:
                        blind_end(work, record)
                        return
                    future.add_done_callback(functools.partial(_finished, record))
            except Exception:  # noqa: BLE001 -- a hook must never break the training step
                self.hook_errors += 1

        return pre, post

    def _poll_loop(self) -> None:
        """Stamp the end of polled Works (``is_completed`` queries the CUDA events for NCCL)."""
        polled = self._polled
        while not self._stop.is_set():
            if not polled:
                time.sleep(self.poll_s)
                continue
            now = time.time_ns()
            for _ in range(len(polled)):
                work, record = polled.popleft()
                if record[END] is not None:
                    continue
                try:
                    done = work.is_completed()
                except RuntimeError:
                    done = True  # the Work failed: it ended
                if done:
                    record[END] = now
                else:
                    polled.append((work, record))
            time.sleep(self.poll_s)

    def _drain_taps(self) -> None:
        """Enter what the C++ hooks recorded, in the order entered (so ``seq`` follows it),
        and write the ends that came since into the records still running."""
        with self._lock:
            taps = list(self._taps)
        codes, recorder = self._op_codes, self.recorder
        for tapped in taps:
            entered, ended, tapped.errors = tapped.tap.drain()
            running = tapped.running
            for op_id, end in ended:
                record = running.pop(op_id, None)
                if record is not None:
                    record[END] = end
            for op_id, code, root, nbytes, enter, end in entered:
                op = codes.get(code)
                target = tapped.log
                if op == "send" or op == "recv":
                    if not 0 <= root < len(tapped.members):
                        op = None  # a peer outside the group: c10d would have refused it
                    else:
                        peer = tapped.members[root]
                        pairs = tapped.pairs
                        target = pairs.get(peer) or _pair(
                            recorder, pairs, tapped.name, tapped.me, peer
                        )
                if op is None:
                    self.hook_errors += 1  # counted like a failed hook: not recorded
                    continue
                record = target.enter(op, nbytes, enter)
                if end:
                    record[END] = end
                else:
                    running[op_id] = record

    def _poll_unfinished(self) -> None:
        still = []
        for work, record in self._unfinished[:]:
            if record[END] is not None:
                continue  # its rank's next operation bounded it: the earlier, closer end
            if work.is_completed():
                record[END] = time.time_ns()
            else:
                still.append((work, record))
        del self._unfinished[:]
        self._unfinished.extend(still)

    def flush(self) -> int:
        """Hand this interval's messages to the sink now; how many."""
        with self._flushing:  # the batching thread and a caller may flush at once
            self._drain_taps()
            self._poll_unfinished()
            messages = self.recorder.messages(time.time_ns())
            try:
                self._sink(messages)
            except Exception as error:  # noqa: BLE001 -- the training must go on
                self.sink_errors += 1
                if self.sink_errors == 1:
                    print(f"c4 instrumentation: sink failed: {error}", file=sys.stderr)
        errors = self.errors()
        if errors and not self._hook_errors_reported:
            self._hook_errors_reported = True
            print(f"c4 instrumentation: {errors} hook errors", file=sys.stderr)
        return len(messages)

    def errors(self) -> int:
        """Hook calls that failed (each one an operation not recorded), Python and C++."""
        return self.hook_errors + sum(tapped.errors for tapped in self._taps)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def close(self) -> None:
        """Remove the hooks, stop batching, send what is left."""
        self.detach()
        self._stop.set()
        for thread in (self._thread, self._poller):
            if thread.is_alive():
                thread.join()
        now = time.time_ns()
        while self._polled:
            work, record = self._polled.popleft()
            if record[END] is None and work.is_completed():
                record[END] = now
        stop_watching(self.attach)
        now = time.time_ns()  # the training returned from every call: its operations ended
        for tapped in self._taps:
            tapped.tap.end_blind(now)
        if self.native is not None:  # ends of what finished before now, not a period later
            self.native.settle_polling(round(max(0.05, 4 * self.poll_s) * 1e6))
        for blind in self._blind:
            for record in blind:
                if record[END] is None:
                    record[END] = now
            blind.clear()
        self.flush()
        close = getattr(self._sink, "close", None)
        if callable(close):
            close()


def _pair(
    recorder: OpRecorder, pairs: dict[int, CommLog], name: str, me: int, peer: int
) -> CommLog:
    low, high = sorted((me, peer))
    log = recorder.comm(f"{name}:p2p:{low}-{high}", 2, 0 if me == low else 1, me)
    pairs[peer] = log
    return log


def instrument(
    job: str,
    sink: Callable[[list[Collective]], None],
    interval_s: float = 1.0,
    node: str | None = None,
    gpu: int | None = None,
    completion: Completion = "auto",
    native: bool | None = None,
    poll_s: float | None = None,
    restart: int | None = None,
) -> TorchInstrumentation:
    """Start recording every process group's operations; call once, early in the script.

    ``node`` defaults to the host name and ``gpu`` to ``LOCAL_RANK`` when it is set.
    ``completion``: what tells an operation ended: ``future`` (the Work's future completes:
    exact for gloo), ``poll`` (``Work.is_completed()``, asked every ``poll_s``; NCCL needs
    it: its future completes at enqueue), ``auto`` (future for gloo, poll for every other
    backend). ``native``: hooks and end times in C++ (`producers.torch_taps`, built on first
    use: no GIL taken, no Python run per operation, polled every 500 µs) or in Python (hooks
    that take the GIL back from c10d, a future callback that takes it in the path ``wait()``
    waits on, a poller thread every 1 ms). ``None``: C++ where the helper can be built, else
    Python, saying why once. ``restart``: the job's restart count, carried by every report
    so that one of a run the job has left is read as that run's.
    """
    if gpu is None and os.environ.get("LOCAL_RANK", "").isdigit():
        gpu = int(os.environ["LOCAL_RANK"])
    host = node or socket.gethostname()
    return TorchInstrumentation(
        job, sink, interval_s, host, gpu, completion, poll_s=poll_s, native=native, restart=restart
    ).start()
