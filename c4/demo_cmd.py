"""``c4 demo``: a simulated cluster with scripted faults through the whole system, live."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from c4.settings import Settings


DEFAULT_REPORT = "c4-demo-report"


def _say(line: str) -> None:
    print(line, flush=True)


def _run_slurm(args: argparse.Namespace, settings: Settings) -> int:
    from c4.demo.slurm_run import (  # noqa: PLC0415 - only this command's
        DEFAULT_STEPS,
        SlurmDemo,
        SlurmOptions,
        need_root,
        print_outcome,
        stops_as_interrupt,
    )

    apart = [
        option
        for option, given in (
            ("--scenario", args.scenario),
            ("--topology", args.topology),
            ("--chaos", args.chaos is not None),
            ("--setup-only", args.setup_only),
            ("--split", args.split),
        )
        if given
    ]
    if apart:
        said = ", ".join(apart)
        print(f"c4: error: --slurm runs its own job: {said} do not apply", file=sys.stderr)
        return 2
    why = need_root()
    if why is not None:
        print(f"c4: error: {why}", file=sys.stderr)
        return 2
    options = SlurmOptions(
        report=None if args.report is None else Path(args.report),
        hangs=args.hangs or 1,
        steps=args.steps or DEFAULT_STEPS,
        keep_topics=args.keep_topics,
    )
    began = time.monotonic()
    with stops_as_interrupt():
        demo = SlurmDemo(options, settings, _say)
        try:
            outcome = demo.run()
        finally:
            demo.close()
    print_outcome(outcome, _say)
    where = f"report: {options.report / 'slurm-demo.json'}   " if options.report else ""
    _say(f"{where}run time {time.monotonic() - began:.0f} s")
    return 0 if outcome.ok else 1


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.slurm:
        return _run_slurm(args, settings)
    if args.hangs is not None or args.steps is not None:
        print("c4: error: --hangs and --steps go with --slurm", file=sys.stderr)
        return 2
    # Imported here: matplotlib, Faust's aiohttp and the simulator are only this command's.
    from c4.demo.options import demo_topology, load_demo_scenario
    from c4.demo.run import DemoOptions, DemoRun, print_chaos, print_timeline

    options = DemoOptions(
        report=Path(args.report or DEFAULT_REPORT),
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
        split=args.split,
    )
    # A bad scenario or topology file is one line before anything starts (topics, workers).
    load_demo_scenario(options.scenario, options.duration)
    demo_topology(options)
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


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        message = f"expected a whole number of at least 1, got {text!r}"
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
    parser.add_argument(
        "--report",
        help=f"report folder (default {DEFAULT_REPORT}; with --slurm: none, the run's files in "
        "a temporary folder)",
    )
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
    parser.add_argument(
        "--split",
        action="store_true",
        help="the streams worker spreads each job's detection over node and job stages "
        "(`c4 streams worker --split`); with --chaos, its kill covers both stages",
    )
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="a real DDP training job on the local Slurm cluster (c4 stack up --slurm; root "
        "only) under srun c4 run, with real faults: --hangs times every rank of one node "
        "stopped (SIGSTOP), then one rank throttled (a straggler); prints per fault the "
        "diagnosis, its latency, the drain reason as sinfo -R prints it and the restart "
        "count, and hang-to-drain, drained-to-running and requeue times",
    )
    parser.add_argument(
        "--hangs",
        type=_at_least_one,
        help="with --slurm: how many node hangs, the node given back between them (1)",
    )
    parser.add_argument(
        "--steps", type=_at_least_one, help="with --slurm: the job's training steps (800)"
    )
    parser.set_defaults(handler=_run)
