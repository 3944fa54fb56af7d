"""``c4 demo``: a simulated cluster with scripted faults through the whole system, live."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from c4.settings import Settings


def _say(line: str) -> None:
    print(line, flush=True)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: matplotlib, Faust's aiohttp and the simulator are only this command's.
    from c4.demo.run import DemoOptions, DemoRun, print_chaos, print_timeline

    options = DemoOptions(
        report=Path(args.report),
        scenario=args.scenario,
        topology=args.topology,
        nodes=args.nodes,
        spines=args.spines,
        duration=args.duration,
        speed=args.speed,
        settle_s=args.settle,
        dashboard_port=None if args.no_dashboard else args.dashboard_port,
        keep_topics=args.keep_topics,
        full=args.full,
        setup_only=args.setup_only,
        chaos_seed=args.chaos,
    )
    began = time.monotonic()
    demo = DemoRun(options, settings, _say)
    if args.setup_only:
        try:
            demo.setup_only()
        finally:
            demo.close()
        return 0
    try:
        outcome = demo.run()
    finally:
        demo.close()
    print_timeline(outcome.timeline, _say)
    if args.chaos is not None:
        print_chaos(outcome.kills, outcome.problems, _say)
    _say(f"report: {outcome.report}   run time {time.monotonic() - began:.0f} s")
    return 0 if outcome.ok else 1


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        message = f"expected a positive number, got {text!r}"
        raise argparse.ArgumentTypeError(message)
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``demo`` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="the whole system live on a simulated cluster with scripted faults",
        description=(
            "Starts the local stack (or uses the configured brokers), creates this run's topics, "
            "loads a generated topology with spares into Redis, starts the streams and actions "
            "workers, a launcher webhook, an alert receiver and the dashboard, runs the "
            "simulator live and prints the timeline: per injected fault its diagnosis, "
            "detection latency and actions. Exit 0 only if every fault was diagnosed and "
            "acted on, with no false finding."
        ),
    )
    parser.add_argument("--scenario", help="scenario JSON (default: the built-in three-job one)")
    parser.add_argument("--topology", help="v1 topology file (default: generated)")
    parser.add_argument("--nodes", type=int, default=32, help="generated topology: nodes (32)")
    parser.add_argument("--spines", type=int, default=4, help="generated: spines per plane (4)")
    parser.add_argument("--duration", type=_positive, help="event seconds (default: scenario's)")
    parser.add_argument("--speed", type=_positive, default=1.0, help="x real time (default 1)")
    parser.add_argument(
        "--settle",
        type=_positive,
        default=25.0,
        help="seconds to wait after the simulator for the last actions (25)",
    )
    parser.add_argument("--report", default="c4-demo-report", help="report folder")
    parser.add_argument(
        "--dashboard-port", type=int, default=8066, help="dashboard on 127.0.0.1 (8066; 0: any)"
    )
    parser.add_argument("--no-dashboard", action="store_true", help="no dashboard")
    parser.add_argument(
        "--keep-topics", action="store_true", help="keep this run's topics (default: deleted)"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="play the whole scenario (default: stop a few seconds after every fault was acted on)",
    )
    parser.add_argument(
        "--setup-only",
        action="store_true",
        help="only create the topics, write topology, scenario and actions configuration into "
        "--report and load the cluster state (the configured names; docker compose's set-up)",
    )
    parser.add_argument(
        "--chaos",
        type=int,
        metavar="SEED",
        help="kill -9 the streams worker, the actions worker, the node agent, Kafka and Redis "
        "once each, in a random order at random moments (seeded), and print the recovery times; "
        "needs the local stack (`c4 stack up`) and a scenario long enough for five recoveries",
    )
    parser.set_defaults(handler=_run)
