"""The reroute action against the local Redis: link_down diagnoses through the whole pipeline.

Per fabric (nodes x 8 NICs, 2 planes): 4 jobs share the nodes, each with one ring
communicator per GPU index (rail), so every node sends 8 flows (8 x nodes in all). The first
diagnosis finds no plan in force and plans every flow; each later one names a leaf~spine
link that the plan in force uses. Measured per diagnosis: dedup, policy, the topology, jobs
and plan read from Redis, the replan, the claim record, the route messages built (Kafka
left out: the publisher only counts them) and the compare-and-set of the new plan.

    python bench/bench_reroute.py [--failures 20] [--sizes 64,256,1024] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from actions.config import parse_config
from actions.drivers.reroute.executor import RerouteExecutor
from actions.drivers.reroute.plan_store import PlanStore
from actions.pipeline.pipeline import Pipeline
from actions.state.store import RedisState
from schemas.base import C4Model
from schemas.messages import Diagnosis, Job
from topology.generate import Shape, generate

JOBS = 4
GPUS = 8


class CountingOutbox:
    """Counts route messages instead of producing them (Kafka is left out)."""

    def __init__(self) -> None:
        self.count = 0

    def publish(self, message: C4Model, key: str | None = None) -> None:
        del message, key
        self.count += 1

    def flush(self) -> None:
        return None


def link_down(index: int, link: str) -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": f"d-{index}",
            "job": None,
            "state": "firing",
            "class": "link_down",
            "onset_ns": 1,
            "ts_ns": 2,
            "suspects": [{"type": "link", "id": link, "score": 0.95}],
        }
    )


def rail_jobs(nodes: list[str]) -> list[Job]:
    """JOBS jobs over the nodes (interleaved), one ring per GPU index on that GPU's NIC."""
    jobs = []
    for j in range(JOBS):
        mine = nodes[j::JOBS]
        ranks = [
            {"rank": GPUS * i + g, "node": node, "gpu": g, "port": f"mlx5_{g}:{1 + g % 2}"}
            for i, node in enumerate(mine)
            for g in range(GPUS)
        ]
        comms = {f"rail{g}": [GPUS * i + g for i in range(len(mine))] for g in range(GPUS)}
        jobs.append(
            Job.model_validate(
                {
                    "v": 1,
                    "kind": "job",
                    "job": f"job-{j}",
                    "ts_ns": 1,
                    "state": "running",
                    "ranks": ranks,
                    "comms": comms,
                }
            )
        )
    return jobs


def run(nodes: int, failures: int, url: str) -> dict[str, float]:
    topology = generate(Shape(nodes=nodes, spines=32 if nodes >= 512 else 8))
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    state = RedisState.connect(url, prefix=prefix)
    plans = PlanStore(state.client, f"{prefix}:plan:")
    outbox = CountingOutbox()
    try:
        state.components.load_topology(topology)
        for job in rail_jobs([node.id for node in topology.nodes]):
            state.jobs.record(job)
        config = parse_config({"policy": {"classes": {"link_down": ["reroute"]}}})
        executor = RerouteExecutor(
            state.components, state.jobs, state.claims, plans, outbox, config.reroute
        )
        pipeline = Pipeline(state, {"reroute": executor}, config, "bench")
        uplinks = [link.id for link in topology.links if "~" in link.id]
        start = time.perf_counter()
        handled = pipeline.handle(link_down(0, uplinks[-1]))
        first_ms = (time.perf_counter() - start) * 1000
        pipeline.finish(handled)
        first = plans.current()
        flows = len(first.plan.paths) if first is not None else 0
        latencies, moved, routes = [], [], []
        for index in range(1, failures + 1):
            current = plans.current()
            if current is None:
                message = "no plan in force after the first reroute"
                raise RuntimeError(message)
            used = sorted(
                {x for p in current.plan.paths if p.via for x in p.links[1:-1]} - set(current.down)
            )
            link = used[(index * 7919) % len(used)]
            before = outbox.count
            start = time.perf_counter()
            handled = pipeline.handle(link_down(index, link))
            latencies.append((time.perf_counter() - start) * 1000)
            pipeline.finish(handled)
            (record,) = handled.records
            if record.status != "done":
                raise RuntimeError(str(record.detail))
            moved.append(float(str(record.detail["moved"])))
            routes.append(float(outbox.count - before))
        ordered = sorted(latencies)
        return {
            "nodes": nodes,
            "flows": flows,
            "first_ms": first_ms,
            "median_ms": statistics.median(ordered),
            "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
            "moved": statistics.median(moved),
            "routes": statistics.median(routes),
        }
    finally:
        keys = list(state.client.scan_iter(match=f"{prefix}:*", count=1000))
        for begin in range(0, len(keys), 500):
            state.client.delete(*keys[begin : begin + 500])
        state.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failures", type=int, default=20)
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    print(
        f"{JOBS} jobs, a ring per rail (8 flows per node); {args.failures} link_down diagnoses"
        " per fabric through dedup, policy and reroute; Redis on localhost, Kafka left out"
    )
    header = ("nodes", "flows", "first plan ms", "median ms", "p99 ms", "moved", "routes")
    print("".join(f"{h:>14}" for h in header))
    for size in (int(x) for x in args.sizes.split(",")):
        row = run(size, args.failures, args.redis_url)
        print(
            f"{row['nodes']:>14.0f}{row['flows']:>14.0f}{row['first_ms']:>14.1f}"
            f"{row['median_ms']:>14.1f}{row['p99_ms']:>14.1f}{row['moved']:>14.0f}"
            f"{row['routes']:>14.0f}"
        )
    print("moved, routes: medians per diagnosis (flows whose path changed; nodes told)")


if __name__ == "__main__":
    main()
