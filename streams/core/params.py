"""Detector parameters: sane defaults, overridable per job."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from streams import StreamsError

NS_PER_S = 1_000_000_000


class ParamsError(StreamsError):
    """A detector parameter is unknown or out of range."""


# Parameters that size a window of samples: an empty window has no median to judge by.
WINDOW_SIZES = frozenset(
    ("straggler_window", "straggler_slices", "slow_baseline_ops", "slow_recent_ops")
)


@dataclass(frozen=True, slots=True)
class DetectorParams:
    """Thresholds and window sizes of the detectors (times in event-time nanoseconds)."""

    # A hang fires after max(hang_min_ns, hang_factor x the communicator's median op time).
    hang_min_ns: int = 5 * NS_PER_S
    hang_factor: float = 20.0
    # A rank (or a node's every rank) silent this long is gone, not waiting.
    silent_after_ns: int = 3 * NS_PER_S
    # The last entrants of each group's recent operations (a straggler's evidence: its lag).
    straggler_window: int = 20
    # Straggler by compute time (streams.core.compute): windows of at least this length
    # between sync points of a rank's largest group; a straggler computes this factor more
    # than its peers' predicts in two thirds of its last ``straggler_slices`` judged windows
    # (at least ``straggler_min_slices``), and is cleared below the resolve factor.
    straggler_slice_ns: int = NS_PER_S
    straggler_slices: int = 7
    straggler_min_slices: int = 4
    straggler_compute_factor: float = 1.06
    straggler_resolve_factor: float = 1.03
    # Communication slowdown: recent transfer time over the baseline by this factor.
    slow_baseline_ops: int = 20
    slow_recent_ops: int = 8
    slow_factor: float = 1.3
    slow_resolve_factor: float = 1.12
    # A connection is slow below this share of the job's median connection throughput.
    slow_conn_share: float = 0.8
    # A fabric link is dark (link_down, not link_degraded) when the slow paths over it fell
    # below this share of their own past throughput: a dark link carries nothing, the flows
    # still hashed onto it crawl on retransmissions; a degraded one keeps a share of it.
    dark_link_share: float = 0.25
    # Link counters: error rates that count as a degraded port when they last for
    # ``degraded_reports`` reports in a row (isolated errors happen on healthy cables).
    symbol_err_per_s: float = 10.0
    retrans_per_s: float = 10.0
    degraded_reports: int = 2
    # How often (event time) the timers of every tracked job are checked.
    tick_ns: int = 250_000_000

    def with_overrides(self, overrides: dict[str, Any]) -> DetectorParams:
        """These parameters with some replaced (e.g. from a job's configuration)."""
        known = {field.name: field.type for field in fields(self)}
        for name, value in overrides.items():
            if name not in known:
                message = f"unknown detector parameter {name!r}"
                raise ParamsError(message)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                message = f"detector parameter {name} must be a non-negative number, got {value!r}"
                raise ParamsError(message)
            if name in WINDOW_SIZES and value < 1:
                message = f"detector parameter {name} is a window size: at least 1, got {value!r}"
                raise ParamsError(message)
        typed: dict[str, Any] = {
            name: (int(value) if isinstance(getattr(self, name), int) else float(value))
            for name, value in overrides.items()
        }
        return replace(self, **typed)

    def hang_after_ns(self, median_op_ns: float | None) -> int:
        """How long without progress makes a hang, given the typical operation time."""
        if median_op_ns is None:
            return self.hang_min_ns
        return max(self.hang_min_ns, int(self.hang_factor * median_op_ns))


PARAMS_DOCUMENT_KEYS = ("defaults", "jobs")


def params_from_document(
    document: Any,
) -> tuple[DetectorParams, dict[str, dict[str, Any]]]:
    """``{"defaults": {...}, "jobs": {"job-1": {...}}}``: parameters, overall and per job.

    `ParamsError` names what is wrong (the document's shape, or the first bad override).
    """
    if not isinstance(document, dict):
        message = "expected a JSON object"
        raise ParamsError(message)
    unknown = sorted(str(key) for key in document if key not in PARAMS_DOCUMENT_KEYS)
    if unknown:
        # A misspelt section ("defautls") would leave every parameter at its default.
        message = f'unknown key {unknown[0]!r}: a parameters file has "defaults" and "jobs"'
        raise ParamsError(message)
    defaults, jobs = document.get("defaults", {}), document.get("jobs", {})
    if not isinstance(defaults, dict) or not isinstance(jobs, dict):
        message = '"defaults" and "jobs" must be JSON objects'
        raise ParamsError(message)
    params = DetectorParams().with_overrides(dict(defaults))
    per_job: dict[str, dict[str, Any]] = {}
    for job, values in jobs.items():
        if not isinstance(values, dict):
            message = f"jobs.{job}: expected a JSON object"
            raise ParamsError(message)
        params.with_overrides(values)  # checked now, applied per job
        per_job[str(job)] = dict(values)
    return params, per_job
