"""``c4 simulate``: write a simulated cluster run as v1 JSON Lines, and its ground truth."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

import orjson

from c4.inputs import load_document
from c4.progress import event_progress, on_terminal
from c4.scenarios import SimulateError, load_scenario, place
from producers.batching import pack_stream
from schemas.base import C4Model
from schemas.codec import encode
from schemas.files import Topology
from simulator import Scenario, ground_truth
from simulator.cluster import Cluster
from simulator.run import simulate_cluster

if TYPE_CHECKING:
    from c4.settings import Settings

BATCH = 4096  # lines per write: fewer system calls, bounded memory


def run_messages(
    cluster: Cluster, scenario: Scenario, pack: bool, shown: bool = False
) -> Iterator[C4Model]:
    """The run's messages in event time; with ``pack``, collective, link and GPU messages
    batched as agents do; with ``shown``, a bar of the event time reached on stderr while it
    is a terminal."""
    messages = simulate_cluster(cluster, scenario)
    if shown:
        start = scenario.start_ns
        messages = event_progress(
            messages,
            lambda message: getattr(message, "ts_ns", start),
            start,
            scenario.duration_s,
            "simulate",
            sys.stderr,
        )
    return pack_stream(messages) if pack else messages


def write_run(
    cluster: Cluster, scenario: Scenario, out: IO[bytes], pack: bool = False
) -> Counter[str]:
    """Simulate and write every message as a JSON line; returns the count per kind. A bar
    shows the progress unless ``out`` is the terminal (the lines themselves show it)."""
    counts: Counter[str] = Counter()
    batch: list[bytes] = []
    for message in run_messages(cluster, scenario, pack, shown=not on_terminal(out)):
        counts[type(message).__name__.lower()] += 1
        batch.append(encode(message))
        if len(batch) >= BATCH:
            out.write(b"\n".join(batch) + b"\n")
            batch.clear()
    if batch:
        out.write(b"\n".join(batch) + b"\n")
    return counts


def truth_lines(cluster: Cluster, scenario: Scenario) -> bytes:
    """The ground-truth file: one JSON line per injected fault."""
    truth = ground_truth(cluster.topology, scenario, cluster)
    return b"".join(orjson.dumps(item.as_dict()) + b"\n" for item in truth)


def publish_run(
    cluster: Cluster, scenario: Scenario, settings: Settings, speed: float, pack: bool = False
) -> int:
    """Publish the run to Kafka live, ``speed`` x real time; returns the records sent."""
    from producers.publisher import Publisher, paced

    publisher = Publisher(settings.kafka_client_config(), settings.topic_prefix)
    sent = 0
    for message in paced(run_messages(cluster, scenario, pack, shown=True), speed):
        publisher.publish(message)
        sent += 1
    publisher.flush()
    return sent


def follow_run(cluster: Cluster, scenario: Scenario, settings: Settings, speed: float) -> int:
    """Publish the run live and apply each new plan in force to its paths, as node agents
    applying their route messages would (the plan store the actions worker keeps in Redis);
    returns the records sent. Redis away: the paths stay as they are meanwhile."""
    from actions.drivers.reroute.plan_store import PlanStore
    from actions.state.base import connect
    from c4.demo.live_sim import LiveSimulator, store_reader

    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    plans = PlanStore(connect(settings.redis_url, password), f"{settings.redis_key_prefix}:plan:")
    simulator = LiveSimulator(cluster, scenario, settings, speed, store_reader(plans))
    simulator.start()
    simulator.join()
    if simulator.error is not None:
        message = f"publishing the run failed: {simulator.error}"
        raise SimulateError(message)
    for change in simulator.applied:
        ports = f" {change.src_port} -> {change.dst_port}" if change.src_port else ""
        print(f"at {change.at_s:.1f} s {change.flow} via {change.via}{ports}", file=sys.stderr)
    return simulator.sent


def _run(args: argparse.Namespace, settings: Settings) -> int:
    scenario = load_scenario(args.scenario, args.seed)
    topology = load_document(args.topology, "topology", Topology) if args.topology else None
    truth_path = args.truth
    if truth_path is None and args.out != "-":
        truth_path = f"{args.out}.truth.jsonl"
    # Every error surfaces here, before any output is written.
    if args.follow_plans and (not args.kafka or args.batch):
        message = "--follow-plans needs --kafka and one record per message (no --batch)"
        raise SimulateError(message)
    if args.start_now:
        scenario = scenario.model_copy(update={"start_ns": time.time_ns()})
    cluster = place(topology, scenario, args.scenario)
    truth = truth_lines(cluster, scenario)
    if args.kafka:
        if truth_path is not None:
            Path(truth_path).write_bytes(truth)
        if args.follow_plans:
            sent = follow_run(cluster, scenario, settings, args.speed)
        else:
            sent = publish_run(cluster, scenario, settings, args.speed, args.batch)
        print(f"{sent} messages published to {settings.kafka_bootstrap}", file=sys.stderr)
        return 0
    if args.out == "-":
        counts = write_run(cluster, scenario, sys.stdout.buffer, args.batch)
        sys.stdout.flush()
    else:
        with open(args.out, "wb") as out:
            counts = write_run(cluster, scenario, out, args.batch)
    if truth_path is not None:
        Path(truth_path).write_bytes(truth)
    summary = ", ".join(f"{count} {kind}" for kind, count in sorted(counts.items()))
    where = f"truth: {truth_path}" if truth_path else "no truth written (--truth FILE)"
    print(f"{sum(counts.values())} messages ({summary}); {where}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``simulate`` subcommand."""
    parser = subparsers.add_parser(
        "simulate",
        help="simulate training jobs with injected faults as v1 messages",
        description=(
            "Write the collective, link, gpu and job messages of a simulated run (JSON Lines, "
            "event time) and one ground-truth line per injected fault."
        ),
    )
    parser.add_argument("--scenario", required=True, help="scenario JSON file")
    parser.add_argument(
        "--topology", help="v1 topology file (default: a fabric generated to fit the scenario)"
    )
    parser.add_argument("--seed", type=int, help="replace the scenario's seed")
    parser.add_argument("--out", default="-", help="output file, or - for stdout (default)")
    parser.add_argument(
        "--truth", help="ground-truth file (default: <out>.truth.jsonl; none for stdout)"
    )
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="publish live to the configured Kafka instead of writing a file",
    )
    parser.add_argument(
        "--speed", type=_positive, default=1.0, help="with --kafka: x real time (default 1)"
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="each interval's collective messages as one collectives record per job and node, "
        "its link and GPU messages as one links and one gpus record per node, as node agents "
        "send them",
    )
    parser.add_argument(
        "--follow-plans",
        action="store_true",
        help="with --kafka: apply each new route plan in force (Redis) to the simulated "
        "paths, as node agents applying c4.route.v1 would",
    )
    parser.add_argument(
        "--start-now",
        action="store_true",
        help="the run starts now (event time = wall clock, as live agents report)",
    )
    parser.set_defaults(handler=_run)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        message = f"expected a positive number, got {text!r}"
        raise argparse.ArgumentTypeError(message)
    return value
