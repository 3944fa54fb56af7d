"""Sustained load on one streams worker with a fault every 30 s: lag, memory, faults found.

One `c4 streams worker` process (a subprocess, as in bench_streams.py) on fresh topics of
the local broker, while 256-rank jobs publish live, one message per rank per second with
64 operations each, `--rate` messages/s in all (rounded up to whole jobs), for
`--duration-s`. Every `--fault-every-s` a fault starts in another job and lasts
`--fault-s`, rotating through
  noncomm_hang  a rank stops entering its next operation; its peers wait in it and keep
                sending heartbeats; then the rank enters and the job goes on,
  noncomm_slow  a rank enters every operation 1.5 ms late (a straggler),
  comm_hang     every rank entered an operation that does not finish, then it finishes,
  node_down     a node's 8 ranks stop reporting, their peers wait for them; then it is back.
Messages are encoded on the fly from pre-encoded pieces (per rank: its header; per job and
second: the operation arrays), stamped with the live wall clock, and sent with
confluent_kafka. Every `--row-s` one row: offered, produced (broker log end), consumed
(the worker's counter of messages taken) and late (dropped by the worker as older than its
clock by more than the lateness bound) messages/s, the group's lag (committed offsets against high
watermarks) and the worker's own lag gauge, its CPU and memory (VmRSS), the bench's memory,
faults injected / found. At the end: each fault's detection latency (the diagnosis arriving
at a consumer minus the fault's onset), p50/p99, lag and memory first/last/max, and the
verdicts "lag bounded", "memory flat" and "every fault found". The report is appended to
bench/results/load.txt; topics, groups and the worker's data folder are removed.

    python bench/bench_load.py [--rate 20000] [--duration-s 300] [--fault-every-s 30]

Issue #9 part 4: twice the per-worker target of issue #4 (10,000 messages/s).

Beside it: load_jobs.py (the jobs and their faults), load_measure.py (samples, rows, the
diagnosis watcher), load_summary.py (the closing figures and verdicts).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from bench_streams import (
    BOOTSTRAP,
    OPS_PER_MESSAGE,
    RANKS,
    REPO,
    S,
    c4,
    free_port,
    producer,
    worker_argv,
)
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from load_jobs import JITTER_NS, JobSim, replay_check, schedule
from load_measure import ROW_HEADER, Run, sample_loop, watch_diagnoses
from load_summary import summary

from c4.settings import Settings

RESULTS = REPO / "bench" / "results" / "load.txt"


def publish(run: Run, sims: list[JobSim], duration_s: int) -> None:
    """Each job's reports at the end of its interval (live event time), faults at onset.

    The jobs' intervals are spread over the second (their phases), as independent agents'
    are: the load comes in a steady stream rather than in one burst a second.
    """
    out = producer()
    rng = random.Random(7)
    onsets = {(fault.job, fault.onset_s): fault for fault in run.faults}
    sent = 0
    for second in range(duration_s):
        for sim in sims:
            start_ns = (run.t0 + second) * S + sim.phase_ns
            wait = (start_ns + S) / S - time.time()
            if wait > 0:
                out.poll(0)
                time.sleep(wait)
            else:
                run.behind_s = max(run.behind_s, -wait)
            fault = onsets.get((sim.name, second))
            if fault is not None:
                sim.fault = fault
                run.injected_at[fault.number] = start_ns / S
                run.injected += 1
            for value in sim.reports(second, start_ns, rng):
                while True:
                    try:
                        out.produce(run.topic, key=sim.key, value=value)
                        break
                    except BufferError:
                        out.poll(0.05)
                sent += 1
                if sent % 512 == 0:
                    out.poll(0)
            run.offered = sent
    out.flush(60)
    run.published_s = time.time() - (run.t0 + 1)  # from the first reports (on time: duration)
    run.produced = sum(log_end(run.topic))


def log_end(topic: str) -> list[int]:
    """The high watermark of each partition of ``topic``."""
    reader = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "bench-load-reader"})
    try:
        metadata = reader.list_topics(topic, timeout=10).topics[topic]
        return [
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in metadata.partitions
        ]
    finally:
        reader.close()


def wait_for_group(group: str, timeout_s: float = 90.0) -> None:
    """Until the worker's consumer group is stable with partitions assigned."""
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            description = admin.describe_consumer_groups([group])[group].result(10)
        except KafkaException:
            description = None
        if description is not None and str(description.state).endswith("STABLE"):
            if any(m.assignment.topic_partitions for m in description.members):
                return
        time.sleep(1)
    message = f"the worker's group {group} did not become stable in {timeout_s:.0f} s"
    raise RuntimeError(message)


def clean_up(prefix: str, group: str) -> None:
    """Delete the run's topics (its prefix and the worker's internal ones) and groups."""
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    names = [n for n in admin.list_topics(timeout=10).topics if n.startswith((prefix, group))]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else []:
        future.result(60)
    for future in admin.delete_consumer_groups([group, group + "-check"]).values():
        try:
            future.result(30)
        except KafkaException:
            pass  # a group that never committed does not exist
    shutil.rmtree(Settings().stack_dir / "faust" / group, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=int, default=20_000, help="messages/s offered")
    parser.add_argument("--duration-s", type=int, default=300)
    parser.add_argument("--fault-every-s", type=int, default=30)
    parser.add_argument("--fault-s", type=int, default=20, help="how long each fault lasts")
    parser.add_argument("--row-s", type=int, default=30, help="seconds between rows")
    parser.add_argument("--grace-s", type=int, default=30, help="wait for diagnoses after")
    parser.add_argument("--lag-bound-s", type=float, default=10.0)
    parser.add_argument("--memory-growth", type=float, default=0.10)
    parser.add_argument("--note", default="", help="a line for the results file")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--replay-check", action="store_true", help="only run each fault kind offline"
    )
    args = parser.parse_args()
    if not 0 < args.fault_s < args.fault_every_s:
        parser.error("--fault-s must be above 0 and below --fault-every-s")
    if args.replay_check:
        return replay_check(args.fault_s)
    jobs = max(1, math.ceil(args.rate / RANKS))
    faults = schedule(jobs, args.duration_s, args.fault_every_s, args.fault_s)
    prefix = f"bench.{uuid.uuid4().hex[:6]}."
    group = f"bench-load-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, C4_TOPIC_PREFIX=prefix, C4_KAFKA_BOOTSTRAP=BOOTSTRAP)
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()[0]
    log = Path(f"/tmp/{group}.log")  # noqa: S108 - a bench's log, named per run
    c4("topics", "create", "--retention-ms", "3600000", env=env)
    jitter_rng = random.Random(3)
    jitter = [[jitter_rng.randrange(JITTER_NS) for _ in range(OPS_PER_MESSAGE)] for _ in range(32)]
    sims = [JobSim(i, jitter, i * S // jobs) for i in range(jobs)]
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(  # noqa: S603 - our own command
            worker_argv(group, port), env=env, cwd=REPO, stdout=sink, stderr=sink
        )
    rows: list[str] = []
    run: Run | None = None
    threads: list[threading.Thread] = []
    grace_end = args.duration_s + args.grace_s
    try:
        wait_for_group(group)
        run = Run(
            t0=math.ceil(time.time()) + 2,
            topic=prefix + "c4.collective.v1",
            diagnosis_topic=prefix + "c4.diagnosis.v1",
            group=group,
            metrics_port=port,
            pid=process.pid,
            faults=faults,
        )
        print(f"{jobs} jobs, {jobs * RANKS:,} msg/s, {len(faults)} faults; worker log {log}")
        print(ROW_HEADER, flush=True)
        threads = [
            threading.Thread(target=watch_diagnoses, args=(run,)),
            threading.Thread(target=sample_loop, args=(run, args.row_s, rows, sys.stdout)),
        ]
        for thread in threads:
            thread.start()
        publish(run, sims, args.duration_s)
        time.sleep(max(0.0, run.t0 + args.duration_s + 0.5 - time.time()))
        run.sampling.set()  # the rows end with the load; diagnoses may still come a while
        threads[1].join(30)
        deadline = run.t0 + grace_end
        while time.time() < deadline and len(run.found) < len(run.injected_at):
            time.sleep(0.5)
        if process.poll() is not None:
            print(f"the worker exited ({process.returncode}); see {log}", file=sys.stderr)
    finally:
        if run is not None:
            run.sampling.set()
            run.watching.set()
        for thread in threads:
            thread.join(30)
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        clean_up(prefix, group)
    if not run.row_samples:
        print("no rows taken", file=sys.stderr)
        return 1
    lines = summary(run, args, jobs, grace_end)
    print("\n".join(lines))
    command = "python bench/bench_load.py " + shlex.join(sys.argv[1:])
    header = [
        f"== {started:%Y-%m-%d %H:%M} UTC  {command}",
        f"machine: {os.cpu_count()} CPUs, load average (1 min) {load_before:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end" + (f"; {args.note}" if args.note else ""),
        "",
        ROW_HEADER,
    ]
    args.results.parent.mkdir(exist_ok=True)
    with args.results.open("a") as results:
        results.write("\n".join([*header, *rows, *lines]) + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
