"""``c4 actions worker``: isolate, restart, reroute and alert on diagnoses, over the Redis state."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from actions import ActionsError
from actions.config import ConfigError, load_config
from actions.metrics import ActionMetrics
from actions.pipeline.pipeline import Pipeline
from actions.state import StateError, StateUnavailable
from actions.transport import KafkaTransport
from actions.worker import (
    EXECUTORS,
    ActionWorker,
    Topics,
    build_executors,
    build_housekeeping,
    worker_id,
)
from c4 import C4Error
from c4.cluster_state import open_state
from c4.security import KafkaAccessError, check_kafka_access, install_secret_redaction, redacted
from c4.stopping import stop_on_signals

if TYPE_CHECKING:
    from c4.settings import Settings


class WorkerStartError(C4Error):
    """The worker's configuration or a service it needs is not usable (exit 2)."""

    exit_code = 2


def _run(args: argparse.Namespace, settings: Settings) -> int:
    logging.basicConfig(
        level=getattr(logging, args.loglevel.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config)
    except ConfigError as error:
        raise WorkerStartError(str(error)) from None
    try:
        config.check_actions(executor.name for executor in EXECUTORS)
    except ConfigError as error:
        message = f"{args.config}: {error}"
        raise WorkerStartError(message) from None
    # HMAC keys, Alertmanager tokens and passwords, the launcher's key: never in a log line.
    secrets = [secret for receiver in config.receivers for secret in receiver.secrets()]
    if config.launcher.webhook is not None and config.launcher.webhook.secret is not None:
        secrets.append(config.launcher.webhook.secret)
    install_secret_redaction(secret.get_secret_value() for secret in secrets)
    try:
        check_kafka_access(settings, timeout_s=5.0, require_answer=False)
    except KafkaAccessError as error:
        raise WorkerStartError(str(error)) from None
    state = open_state(settings)
    try:
        state.client.ping()
    except Exception as error:  # noqa: BLE001 - any failure to reach Redis is reported alike
        message = f"redis at {redacted(settings.redis_url)} does not answer ({error})"
        raise WorkerStartError(message) from None
    log = logging.getLogger("c4.actions")
    try:
        if state.components.fabric() is None:
            log.warning("no topology in the cluster state: reroute fails until `c4 state load`")
    except (StateError, StateUnavailable) as error:
        log.warning("%s: reroute fails until `c4 state load`", error)
    group = args.group or settings.names.actions_group
    with stop_on_signals() as stop:
        topics = Topics.with_prefix(settings.topic_prefix)
        metrics = ActionMetrics()
        if args.metrics_port:
            metrics.serve(args.metrics_port, args.metrics_address or settings.metrics_address)
        transport = KafkaTransport(
            settings.kafka_client_config(),
            group,
            [topics.diagnosis, topics.job],
            settings.topic_prefix,
            stop,
        )
        actor = worker_id()
        try:
            executors = build_executors(state, config, transport, metrics)
            pipeline = Pipeline(state, executors, config, actor, dry_run=args.dry_run)
            mode = " (dry run: nothing is changed)" if args.dry_run else ""
            log.info("worker %s: group %s, %s%s", actor, group, topics.diagnosis, mode)
            housekeeping = None if args.dry_run else build_housekeeping(state, config, actor)
            ActionWorker(transport, state.jobs, pipeline, topics, metrics, stop, housekeeping).run()
        except (StateUnavailable, ActionsError) as error:
            raise WorkerStartError(str(error)) from None
        finally:
            transport.close()
            state.close()
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``actions worker`` subcommand."""
    parser = subparsers.add_parser("actions", help="the action workers")
    actions = parser.add_subparsers(dest="actions_command", required=True, metavar="ACTION")
    worker = actions.add_parser(
        "worker",
        help="act on diagnoses: isolate, restart on spares, reroute, alert",
        description=(
            "Consumes c4.diagnosis.v1 and c4.job.v1; records every decision on c4.action.v1,"
            " route plans on c4.route.v1 (the topology is the one `c4 state load` stored);"
            " commits an offset only once its outcome is recorded."
        ),
    )
    worker.add_argument("--config", help="YAML or JSON configuration (default: built-in policy)")
    worker.add_argument(
        "--group",
        help="consumer group (default: the deployment's, <C4_DEPLOYMENT>.c4-actions,"
        " or c4-actions)",
    )
    worker.add_argument(
        "--dry-run", action="store_true", help="record decisions without changing anything"
    )
    worker.add_argument(
        "--metrics-port", type=int, default=9465, help="Prometheus /metrics port (0: off)"
    )
    worker.add_argument(
        "--metrics-address",
        help="address /metrics binds (default C4_METRICS_ADDRESS, else 127.0.0.1;"
        " 0.0.0.0 for a Prometheus in another container)",
    )
    worker.add_argument("--loglevel", default="info", choices=("debug", "info", "warning", "error"))
    worker.set_defaults(handler=_run)
