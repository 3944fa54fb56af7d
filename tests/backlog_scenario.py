"""The live backlog scenario: four jobs, faults on each, read in every order of partitions
(tests/integration/test_live_backlog.py, tests/unit/test_backlog_measurement.py)."""

from __future__ import annotations

from typing import Any

SCENARIO: dict[str, Any] = {
    "seed": 11,
    "duration_s": 30,
    "jobs": [{"id": f"job-{c}", "ranks": 16, "compute_ms": 120} for c in "abcd"],
    "faults": [
        {"type": "gpu_stop", "job": "job-a", "rank": 3, "at_s": 12},
        {"type": "link_down", "node": "node-003", "port": "mlx5_1:1", "at_s": 14},
        {"type": "slow_gpu", "job": "job-c", "rank": 5, "factor": 1.3, "at_s": 6},
        {
            "type": "port_degraded",
            "node": "node-005",
            "port": "mlx5_2:1",
            "factor": 0.4,
            "at_s": 10,
        },
        {"type": "node_down", "node": "node-007", "at_s": 16},
    ],
}
