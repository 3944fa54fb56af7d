"""Action pipeline against the local Redis: dedup -> policy -> isolate -> restart, per diagnosis.

Kafka is left out (the job placement sink is a no-op): this measures what the worker adds per
diagnosis on top of one produce+flush. Prints a table of latencies (median, p99) and rates.

    python bench/bench_actions.py [--diagnoses 300] [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from actions.config import parse_config
from actions.drivers.state.executors import IsolateExecutor, RestartExecutor
from actions.launcher import JobLauncher
from actions.pipeline.pipeline import Pipeline
from actions.state.store import RedisState
from schemas.messages import Diagnosis, Job
from topology.generate import Shape, generate


def diagnosis(index: int, job: str, node: str, cls: str) -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": f"d-{index}",
            "job": job,
            "state": "firing",
            "class": cls,
            "onset_ns": 1,
            "ts_ns": 2,
            "suspects": [{"type": "gpu", "id": f"{node}/gpu0", "score": 0.9}],
        }
    )


def run(count: int, url: str) -> list[tuple[str, float, float, float]]:
    nodes = 2 * count + 8
    topology = generate(Shape(nodes=nodes, spines=4, nics=1, planes=2, nodes_per_leaf=16, gpus=8))
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    state = RedisState.connect(url, prefix=prefix)
    rows = []
    try:
        state.components.load_topology(topology)
        ids = [node.id for node in topology.nodes]
        for spare in ids[count : 2 * count]:
            now = time.time_ns()
            state.components.add_spare(spare, now, now // 1_000_000, "bench")
        unlimited = {"actions": 1_000_000, "window_s": 60}
        # Only the classes measured here (the default map also routes link findings to reroute:
        # bench/bench_reroute.py measures that).
        classes = {"comm_slow": ["alert"], "noncomm_hang": ["isolate", "restart", "alert"]}
        config = parse_config(
            {
                "policy": {
                    "job_rate": unlimited,
                    "cluster_rate": unlimited,
                    "max_restarts": 10**6,
                    "classes": classes,
                }
            }
        )
        executors = {
            "isolate": IsolateExecutor(state.components, config),
            "restart": RestartExecutor(
                state.jobs, state.claims, config, lambda job: None, JobLauncher(config.launcher)
            ),
            "alert": IsolateExecutor(state.components, config),  # not reached: no receivers
        }
        pipeline = Pipeline(state, executors, config, "bench")
        for index, node in enumerate(ids[:count]):
            job = Job.model_validate(
                {
                    "v": 1,
                    "kind": "job",
                    "job": f"job-{index}",
                    "ts_ns": 1,
                    "state": "running",
                    "ranks": [{"rank": r, "node": node, "gpu": r} for r in range(8)],
                    "comms": {},
                }
            )
            state.jobs.record(job)
        for label, cls in (
            ("alert only (no receiver)", "comm_slow"),
            ("isolate + restart", "noncomm_hang"),
        ):
            latencies = []
            began = time.perf_counter()
            for index, node in enumerate(ids[:count]):
                message = diagnosis(
                    index if cls == "noncomm_hang" else count + index, f"job-{index}", node, cls
                )
                start = time.perf_counter()
                handled = pipeline.handle(message)
                pipeline.finish(handled)
                latencies.append(time.perf_counter() - start)
            total = time.perf_counter() - began
            ordered = sorted(latencies)
            rows.append(
                (
                    label,
                    statistics.median(ordered) * 1000,
                    ordered[int(0.99 * (len(ordered) - 1))] * 1000,
                    count / total,
                )
            )
        started = time.perf_counter()
        for index, node in enumerate(ids[:count]):
            pipeline.handle(diagnosis(index, f"job-{index}", node, "noncomm_hang"))
        rows.append(
            (
                "duplicate (already done)",
                1000 * (time.perf_counter() - started) / count,
                float("nan"),
                count / (time.perf_counter() - started),
            )
        )
    finally:
        keys = list(state.client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            state.client.delete(*keys[start : start + 500])
        state.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diagnoses", type=int, default=300)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    print(f"{args.diagnoses} diagnoses per path, Redis on localhost, Kafka left out")
    print(f"{'path':<28}{'median ms':>10}{'p99 ms':>10}{'per s':>10}")
    for label, median, p99, rate in run(args.diagnoses, args.redis_url):
        tail = "-" if p99 != p99 else f"{p99:.2f}"  # NaN: not measured per call
        print(f"{label:<28}{median:>10.2f}{tail:>10}{rate:>10.0f}")


if __name__ == "__main__":
    main()
