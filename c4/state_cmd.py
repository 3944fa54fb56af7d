"""``c4 state``: the cluster state in Redis: load a topology, add spares, show, release."""

from __future__ import annotations

import argparse
import getpass
import time
import uuid
from typing import TYPE_CHECKING

import orjson
from pydantic import JsonValue

from actions import ActionsError
from actions.config import ConfigError, Scheduler, load_config
from actions.drivers.kubernetes.client import Answer as KubeAnswer
from actions.drivers.kubernetes.client import Kube, KubeError
from actions.drivers.reroute.executor import give_back
from actions.drivers.reroute.plan_store import PlanStore
from actions.drivers.scheduler_steps import node_of
from actions.drivers.slurm.cli import Answer, CommandRunner, Slurm, SlurmError
from actions.state.store import RedisState
from actions.transport import Outbox
from c4 import C4Error
from c4.cluster_state import open_state
from c4.inputs import load_document
from planner import PlannerError
from schemas.base import C4Model
from schemas.files import Topology
from schemas.messages import Action

if TYPE_CHECKING:
    from c4.settings import Settings


class StateCommandError(C4Error):
    """The cluster state refused a request or could not be reached."""


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _plural(kind: str) -> str:
    return kind + ("es" if kind.endswith("h") else "s")


def _load(args: argparse.Namespace, state: RedisState, settings: Settings) -> int:
    topology = load_document(args.topology, "topology", Topology)
    counts = state.components.load_topology(topology)
    summary = ", ".join(f"{count} {_plural(kind)}" for kind, count in counts.items())
    print(f"loaded {args.topology} under {settings.redis_key_prefix}: {summary}")
    return 0


def _spare(args: argparse.Namespace, state: RedisState, settings: Settings) -> int:
    del settings
    code = 0
    for node in args.nodes:
        now = time.time_ns()
        try:
            answer = state.components.add_spare(node, now, now // 1_000_000, _actor())
        except ActionsError as error:
            print(f"{node}: {error}")
            code = 1
            continue
        if answer.outcome in {"ok", "same"}:
            print(f"{node} spare" + (" (already)" if answer.outcome == "same" else ""))
        else:
            print(f"{node}: not added, it is {answer.state or answer.outcome}")
            code = 1
    return code


def _show(args: argparse.Namespace, state: RedisState, settings: Settings) -> int:
    del settings
    snapshot = state.snapshot()
    if args.json:
        print(orjson.dumps(snapshot, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"prefix {snapshot['prefix']}, {snapshot['audit_entries']} audit entries")
    for kind, info in snapshot["components"].items():
        counts = ", ".join(f"{n} {state_}" for state_, n in info["counts"].items() if n)
        print(f"{_plural(kind)}: {counts or 'none'}")
        for item in info["not_healthy"]:
            why = f" ({item['reason']})" if item["reason"] else ""
            by = f" [{item['diagnosis']}]" if item["diagnosis"] else ""
            print(f"  {item['id']} {item['state']} epoch {item['epoch']}{why}{by}")
    print(f"spares: {', '.join(snapshot['spares']) or 'none'}")
    for job in snapshot["jobs"]:
        print(
            f"job {job['job']}: {job['state']}, {job['ranks']} ranks on {len(job['nodes'])}"
            f" nodes, {job['restarts']} restarts, epoch {job['epoch']}"
        )
    return 0


def _resume_in_scheduler(config_path: str, kind: str, ident: str) -> dict[str, JsonValue]:
    """Give the part's node back in the scheduler the actions worker drives, where c4 took
    it out for this part; a node a person drained or cordoned stays so."""
    try:
        config = load_config(config_path)
    except ConfigError as error:
        message = f"released in Redis (audited), scheduler not told: {error}"
        raise StateCommandError(message) from None
    scheduler = config.scheduler
    node = node_of(kind, ident)
    if node is None:
        return {}
    if scheduler.kind == "kubernetes":
        return _release_in_kubernetes(scheduler, node, ident)
    if scheduler.kind != "slurm":
        return {}
    slurm = Slurm(CommandRunner(scheduler.slurm_conf, scheduler.command_timeout_s))
    try:
        answer = slurm.resume(node, ident)
    except SlurmError as error:
        message = f"released in Redis (audited), but Slurm did not resume {node}: {error}"
        raise StateCommandError(message) from None
    said = {
        Answer.DONE: f"slurm: {node} resumed",
        Answer.NOT_DRAINED: f"slurm: {node} was not drained",
        Answer.HELD: f"slurm: {node} left drained: a person drained it",
        Answer.KEPT: f"slurm: {node} left drained: c4 drained it for another part",
    }
    print(said.get(answer, f"slurm: {node}: {answer.value}"))
    return {"slurm": answer.value, "node": node}


def _release_in_kubernetes(scheduler: Scheduler, node: str, ident: str) -> dict[str, JsonValue]:
    """Remove c4's taint, condition and cordon of the part's node (only c4's)."""
    from actions.drivers.kubernetes.official_api import (
        ClientApi,  # the Kubernetes client: imported when used
    )

    try:
        api = ClientApi(scheduler.kubeconfig, scheduler.command_timeout_s)
        try:
            answer = Kube(api, scheduler).release(node, ident)
        finally:
            api.close()
    except KubeError as error:
        message = f"released in Redis (audited), but c4's marks stay on {node}: {error}"
        raise StateCommandError(message) from None
    said = {
        KubeAnswer.DONE: f"kubernetes: c4's taint and condition removed from {node}"
        " (uncordoned unless a person cordoned it)",
        KubeAnswer.NOT_ISOLATED: f"kubernetes: {node} had no mark of c4",
        KubeAnswer.KEPT: f"kubernetes: {node} stays cordoned: c4 isolated another part of it",
    }
    print(said.get(answer, f"kubernetes: {node}: {answer.value}"))
    return {"kubernetes": answer.value, "node": node}


def _release(args: argparse.Namespace, state: RedisState, settings: Settings) -> int:
    now = time.time_ns()
    answer = state.components.release(args.id, now, now // 1_000_000, _actor())
    if answer.outcome not in {"ok", "same"}:
        message = f"{args.id} not released: {answer.outcome} {answer.state}".rstrip()
        raise StateCommandError(message)
    kind = state.components.kind_of(args.id) or "component"
    print(f"{kind} {args.id} released (epoch {answer.epoch})")
    detail: dict[str, JsonValue] = {"kind": kind, "epoch": answer.epoch, "actor": _actor()}
    outbox = Outbox(settings.kafka_client_config(), settings.topic_prefix)
    plans = PlanStore(state.client, f"{state.keys.prefix}:plan:")
    try:
        # A link the reroute keeps out of the plan is usable again only once a plan says so.
        back = give_back(
            state.components, state.jobs, plans, _Flushing(outbox), kind, args.id, now, _actor()
        )
    except (ActionsError, PlannerError) as error:
        message = f"released in Redis (audited), but not given back to the route plan: {error}"
        raise StateCommandError(message) from None
    if back is not None:
        before = "-" if back.before_max_util is None else f"{back.before_max_util:.2f}"
        print(
            f"back in the route plan: {', '.join(back.links)} (plan {back.plan}, "
            f"{back.moved} flows moved, {back.routes} route messages, "
            f"max link util {before} -> {back.after_max_util:.2f})"
        )
        detail |= {"plan": back.plan, "moved": back.moved, "links": list(back.links)}
    if args.config is not None:
        detail |= _resume_in_scheduler(args.config, kind, args.id)
    record = Action(
        v=1,
        kind="action",
        id="a-" + uuid.uuid4().hex[:16],
        diagnosis=None,
        ts_ns=now,
        action="release",
        target=args.id,
        status="done",
        detail=detail,
    )
    try:
        outbox.publish(record)
        outbox.flush(timeout_s=30)
    except ActionsError as error:
        message = f"released in Redis (audited) but not recorded on c4.action.v1: {error}"
        raise StateCommandError(message) from None
    return 0


class _Flushing:
    """The outbox with a bounded flush, as the reroute's publisher."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    def publish(self, message: C4Model, key: str | None = None) -> None:
        self._outbox.publish(message, key=key)

    def flush(self) -> None:
        self._outbox.flush(timeout_s=30)


def _audit(args: argparse.Namespace, state: RedisState, settings: Settings) -> int:
    del settings
    for entry in state.audit.entries(args.count):
        print(orjson.dumps(entry).decode())
    return 0


def _run(args: argparse.Namespace, settings: Settings) -> int:
    state = open_state(settings)
    try:
        code: int = args.state_handler(args, state, settings)
    except ActionsError as error:
        raise StateCommandError(str(error)) from None
    finally:
        state.close()
    return code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``state load|spare|show|release|audit`` subcommand."""
    parser = subparsers.add_parser(
        "state", help="the cluster state in Redis (topology, spares, isolations, jobs)"
    )
    actions = parser.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    load = actions.add_parser("load", help="record a topology's nodes, ports, switches, links")
    load.add_argument("--topology", required=True, help="v1 topology file")
    load.set_defaults(state_handler=_load)
    spare = actions.add_parser("spare", help="add healthy idle nodes to the spare pool")
    spare.add_argument("nodes", nargs="+", metavar="NODE")
    spare.set_defaults(state_handler=_spare)
    show = actions.add_parser("show", help="states, spares and jobs")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(state_handler=_show)
    release = actions.add_parser("release", help="return an isolated part to service (audited)")
    release.add_argument("id", metavar="ID", help="node, GPU, port, link or switch id")
    release.add_argument(
        "--config",
        help="the actions worker's configuration: with a Slurm scheduler, the node is resumed "
        "there too, only while its drain reason is c4's for this part",
    )
    release.set_defaults(state_handler=_release)
    audit = actions.add_parser("audit", help="the newest audit entries as JSON Lines")
    audit.add_argument("--count", type=int, default=100, help="how many (default 100)")
    audit.set_defaults(state_handler=_audit)
    parser.set_defaults(handler=_run)
