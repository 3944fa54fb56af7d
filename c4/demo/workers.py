"""The demo's worker subprocesses: the streams worker, the actions worker and (chaos runs) the
node agent, each a ``c4 ...`` command with the run's environment and a log of its own."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from actions.worker import EXECUTORS
from c4.demo import Say
from c4.demo.options import DemoOptions
from c4.demo.prepare import HOOK_SECRET_ENV, actions_config
from c4.demo.processes import Child, free_port
from c4.settings import Settings


def worker_env(settings: Settings, secret: str | None = None) -> dict[str, str]:
    """The workers' environment: this run's Kafka, Redis and prefixes, the webhook secret
    when the run has webhooks."""
    s = settings
    return {
        **os.environ,
        "C4_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
        "C4_REDIS_URL": s.redis_url,
        "C4_TOPIC_PREFIX": s.topic_prefix,
        "C4_TOPIC_PARTITIONS": str(s.topic_partitions),
        "C4_REDIS_KEY_PREFIX": s.redis_key_prefix,
        **({} if secret is None else {HOOK_SECRET_ENV: secret}),
        "PYTHONUNBUFFERED": "1",
    }


def start_workers(
    settings: Settings,
    options: DemoOptions,
    names: tuple[str, str],
    report: Path,
    hooks_url: str,
    secret: str,
    children: list[Child],
    say: Say,
) -> dict[str, int]:
    """Start the workers (and the node agent when ``options`` ask for chaos); their ports.

    ``names`` is the run's (app id, run id). Each process goes into ``children`` as soon as it
    runs, so the caller stops it even when a later one fails to start or to open its port.
    """
    app_id, run_id = names
    logs = report / "logs"
    env = worker_env(settings, secret)
    reroute = any(executor.name == "reroute" for executor in EXECUTORS)
    config_path = report / "actions.yaml"
    config_path.write_text(yaml.safe_dump(actions_config(hooks_url, reroute)))
    web_port, streams_metrics, actions_metrics = free_port(), free_port(), free_port()
    clock_rate = str(options.speed)
    streams = Child(
        "streams worker",
        [
            "streams",
            "worker",
            "--app-id",
            app_id,
            "--topology",
            str(report / "topology.json"),
            "--clock-rate",
            clock_rate,
            "--web-port",
            str(web_port),
            "--metrics-port",
            str(streams_metrics),
            "--loglevel",
            "warn",
            *(() if options.chaos_seed is None else ("--session-timeout", "6")),
            *(("--split",) if options.split else ()),
        ],
        env,
        logs,
        logs / "streams-worker.log",
    )
    children.append(streams)
    actions = Child(
        "actions worker",
        [
            "actions",
            "worker",
            "--config",
            str(config_path),
            "--group",
            f"{app_id}-actions",
            "--metrics-port",
            str(actions_metrics),
        ],
        env,
        logs,
        logs / "actions-worker.log",
    )
    children.append(actions)
    ports = {"streams web": web_port, "streams metrics": streams_metrics}
    ports["actions metrics"] = actions_metrics
    if options.chaos_seed is not None:
        children.append(node_agent(run_id, report, env))
    actions.wait_port(actions_metrics, 60)
    streams.wait_port(web_port, 120)
    say(
        f"workers: streams (pid {streams.pid}, metrics :{streams_metrics}), "
        f"actions (pid {actions.pid}, metrics :{actions_metrics}); logs in {logs}"
    )
    return ports


def node_agent(run_id: str, report: Path, env: dict[str, str]) -> Child:
    """The node agent that relays the simulated nodes' records (chaos runs)."""
    logs = report / "logs"
    return Child(
        "node agent",
        [
            "agent",
            "--node",
            f"c4-demo-{run_id}",
            "--handoff",
            str(report / "handoff"),
            "--handoff-state",
            str(report / "agent-spool" / "handoff-offsets.json"),
            "--spool-dir",
            str(report / "agent-spool"),
            "--no-sysfs",
            "--no-nvml",
            "--interval",
            "0.2",
        ],
        env,
        logs,
        logs / "node-agent.log",
    )
