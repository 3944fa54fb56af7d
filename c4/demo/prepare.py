"""What a demo run sets up around its workers: the stack, the plan in force, the actions config.

Also what it removes again: the run's own topics. Everything here talks to Kafka or Redis
directly; the workers themselves are started by `c4.demo.workers`.
"""

from __future__ import annotations

import redis
from confluent_kafka.admin import AdminClient

from c4.dashboard.model import link_loads
from c4.demo import DemoError, Say
from c4.settings import Settings
from c4.stack import stack_up
from planner.reroute import CurrentPlan, job_flows
from schemas.files import Plan, PlanPath, Topology
from simulator.cluster import Cluster
from simulator.run import job_message
from topology.model import Fabric

HOOK_SECRET_ENV = "C4_DEMO_HOOK_SECRET"  # noqa: S105 - the name of the variable
LOCAL_HOSTS = ("127.0.0.1", "localhost")


def simulator_plan(topology: Topology, cluster: Cluster, ts_ns: int) -> CurrentPlan:
    """The simulated fabric's routes as the plan in force (it runs under C4P: ``p-sim``).

    With it in the plan store, a reroute moves only the flows that crossed the failed link,
    as it would on a real fabric, instead of planning every flow afresh.
    """
    fabric = Fabric.from_topology(topology)
    conns = {
        f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}": conn
        for job in cluster.jobs
        for comm in job.comms
        for conn in comm.network()
    }
    jobs = [job_message(job, ts_ns) for job in cluster.jobs]
    paths = []
    vias: dict[str, str | None] = {}
    for flow in job_flows(fabric, jobs).flows:
        conn = conns.get(flow.id)
        via = conn.via if conn is not None else None
        links = (flow.src, *conn.links, flow.dst) if conn is not None else (flow.src, flow.dst)
        vias[flow.id] = via
        paths.append(PlanPath(flow=flow.id, via=via, links=links))
    loads, _, _ = link_loads(fabric, jobs, vias)
    speeds = {link.id: link.gbps for link in topology.links}
    worst = max((load / speeds[link] for link, load in loads.items()), default=0.0)
    plan = Plan(v=1, kind="plan", paths=tuple(paths), max_util=round(worst, 6))
    return CurrentPlan("p-sim", plan, (), ts_ns)


def actions_config(hooks_url: str, reroute: bool) -> dict[str, object]:
    """The actions worker's configuration: act on every class, launcher and receiver here."""
    hard = ["isolate", "restart", "alert"]
    links = ["reroute", "alert"] if reroute else ["isolate", "alert"]
    return {
        "policy": {
            "classes": {
                "noncomm_hang": [*hard],
                "gpu_fault": [*hard],
                "node_down": [*hard],
                # C4 takes a straggling GPU's node out and restarts the job on a spare.
                "noncomm_slow": [*hard],
                "comm_slow": ["isolate", "alert"],
                "comm_hang": ["isolate", "alert"],
                "link_down": [*links],
                "link_degraded": [*links],
            },
        },
        "retry": {"tries": 4, "backoff_s": 0.2, "max_backoff_s": 2},
        "launcher": {"webhook": {"url": f"{hooks_url}/launch", "secret_env": HOOK_SECRET_ENV}},
        "receivers": [
            {"name": "demo-oncall", "url": f"{hooks_url}/alert", "secret_env": HOOK_SECRET_ENV}
        ],
    }


def _kafka_answers(settings: Settings) -> bool:
    admin = AdminClient({**settings.kafka_client_config(), "socket.timeout.ms": 3000})
    try:
        admin.list_topics(timeout=4)
    except Exception:  # noqa: BLE001 - any failure means "not reachable"
        return False
    return True


def _redis_answers(settings: Settings) -> bool:
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    client = redis.Redis.from_url(settings.redis_url, password=password, socket_timeout=3)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def ensure_stack(settings: Settings, say: Say) -> bool:
    """Use the configured Kafka and Redis, or start the local stack; True if this started it."""
    if _kafka_answers(settings) and _redis_answers(settings):
        say(f"stack: using Kafka {settings.kafka_bootstrap} and Redis {settings.redis_url}")
        return False
    host = settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)[0]
    if host not in LOCAL_HOSTS:
        message = f"Kafka at {settings.kafka_bootstrap} or Redis at {settings.redis_url} is away"
        raise DemoError(message)
    say("stack: starting the local Kafka and Redis (c4 stack up)")
    statuses = stack_up(settings, progress=lambda line: say(f"stack: {line}"))
    return any(status.detail != "already running" for status in statuses)


def delete_topics(settings: Settings, prefixes: tuple[str, ...]) -> int:
    """Delete every topic whose name starts with one of ``prefixes``; how many there were."""
    admin = AdminClient(settings.kafka_client_config())
    names = [n for n in admin.list_topics(timeout=10).topics if n.startswith(prefixes)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(30)
    return len(names)
