"""dcgm-exporter's series -> v1 ``gpu`` messages, by DCGM field name (docs/exporters.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from producers.exporters.scrape import Problems, host_of, located
from producers.nvml import throttle_names
from producers.prometheus_text import Sample
from producers.sysfs import MAX_COUNTER
from schemas.base import C4Model
from schemas.messages import Gpu

# --- DCGM fields (dcgm-exporter's etc/default-counters.csv names) -> gpu message -------------
XID = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the value of the last XID seen
TEMP = "DCGM_FI_DEV_GPU_TEMP"  # C
POWER = "DCGM_FI_DEV_POWER_USAGE"  # W
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz
ECC_DBE = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")  # first present
REMAPPED_ROWS = ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")
RETIRED_PAGES = ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE")
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
# DCGM 3.3 renamed the throttle field (same id, same bits as NVML's clock event reasons).
THROTTLE = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
NVLINK_ERRORS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
DCGM_FAMILIES: tuple[str, ...] = (
    XID,
    TEMP,
    POWER,
    SM_CLOCK,
    *ECC_DBE,
    *REMAPPED_ROWS,
    *RETIRED_PAGES,
    ROW_REMAP_FAILURE,
    *THROTTLE,
    *NVLINK_ERRORS,
)
# DCGM writes "no value" as these (DCGM_INT64_BLANK and up, DCGM_FP64_BLANK and up).
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
HOSTNAME_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid")


# --- gpu messages ----------------------------------------------------------------------------


@dataclass(slots=True)
class XidTracker:
    """dcgm-exporter shows the last XID of each GPU, not each one: a value that differs from
    the one seen before (the first one seen included) is a new XID. The same XID again is
    not visible this way."""

    last: dict[tuple[str, int], int] = field(default_factory=dict)

    def new(self, node: str, gpu: int, value: int) -> tuple[int, ...]:
        previous = self.last.get((node, gpu))
        self.last[(node, gpu)] = value
        return (value,) if value != 0 and value != previous else ()


@dataclass(slots=True)
class _GpuSeries:
    uuid: str | None = None
    device: dict[str, Sample] = field(default_factory=dict)  # whole-GPU series
    instance: dict[str, Sample] = field(default_factory=dict)  # MIG instances' series

    def get(self, name: str) -> Sample | None:
        return self.device.get(name) or self.instance.get(name)


def _gpu_node(labels: Mapping[str, str], node: str, label_node: bool) -> str:
    if label_node:
        for name in (*HOSTNAME_LABELS, "instance"):
            value = labels.get(name)
            if value:
                return host_of(value) if name == "instance" else value
    return node


def _gpu_int(sample: Sample, where: str, problems: Problems) -> int | None:
    value = sample.as_int()
    if value is not None and value >= DCGM_INT64_BLANK:
        return None  # DCGM's blank: not supported here
    if value is None or value < 0 or value > MAX_COUNTER:
        problems.add(f"{where} {located(sample)}: not a count: {sample.text[:40]!r}")
        return None
    return value


def _gpu_float(sample: Sample, where: str, problems: Problems, low: float) -> float | None:
    value = sample.value
    if math.isfinite(value) and value >= DCGM_FP64_BLANK:
        return None  # DCGM's blank
    if not math.isfinite(value) or value < low:
        problems.add(f"{where} {located(sample)}: impossible value {sample.text[:40]!r}")
        return None
    return value


def _sum(series: _GpuSeries, names: Sequence[str], where: str, problems: Problems) -> int | None:
    """The sum of the counts present among ``names``; None when none is."""
    total, found = 0, False
    for name in names:
        sample = series.get(name)
        if sample is None:
            continue
        value = _gpu_int(sample, where, problems)
        if value is not None:
            total, found = total + value, True
    return min(total, MAX_COUNTER) if found else None


def _first(series: _GpuSeries, names: Sequence[str]) -> Sample | None:
    for name in names:
        sample = series.get(name)
        if sample is not None:
            return sample
    return None


def _gpu_fields(series: _GpuSeries, where: str, problems: Problems) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, key, low in (
        (TEMP, "temp_c", -273.15),
        (POWER, "power_w", 0.0),
        (SM_CLOCK, "sm_mhz", 0.0),
    ):
        sample = series.get(name)
        if sample is not None:
            value = _gpu_float(sample, where, problems, low)
            if value is not None:
                fields[key] = float(value)
    ecc = _first(series, ECC_DBE)
    if ecc is not None:
        fields["ecc_dbe"] = _gpu_int(ecc, where, problems)
    # As producers.nvml: remapped rows (both kinds) on GPUs that remap, else retired pages.
    rows = _sum(series, REMAPPED_ROWS, where, problems)
    fields["retired_pages"] = (
        rows if rows is not None else _sum(series, RETIRED_PAGES, where, problems)
    )
    throttle = _first(series, THROTTLE)
    if throttle is not None:
        mask = _gpu_int(throttle, where, problems)
        if mask is not None:
            fields["throttle"] = throttle_names(mask)
    fields["nvlink_err"] = _sum(series, NVLINK_ERRORS, where, problems)
    failure = series.get(ROW_REMAP_FAILURE)
    if failure is not None and _gpu_int(failure, where, problems):
        # The v1 gpu message has no field for it: said here, as a problem of the GPU.
        problems.add(f"{where}: row remapping failed ({ROW_REMAP_FAILURE} = {failure.text})")
    return {key: value for key, value in fields.items() if value is not None}


def gpu_messages(
    samples: Iterable[Sample],
    node: str,
    ts_ns: int,
    xids: XidTracker,
    *,
    label_node: bool = False,
) -> tuple[list[C4Model], list[str]]:
    """One gpu message per GPU found among dcgm-exporter's ``samples``, with the problems.

    ``label_node``: the node is the series' ``Hostname``/``hostname`` label (or the host of
    its ``instance``) where it has one, else ``node``.
    """
    lines: list[str] = []
    problems = Problems(lines)
    wanted = frozenset(DCGM_FAMILIES)
    gpus: dict[tuple[str, int], _GpuSeries] = {}
    for sample in samples:
        if sample.name not in wanted:
            continue
        index_text = sample.labels.get("gpu")
        if index_text is None:
            problems.add(f"{located(sample)}: no gpu label")
            continue
        if not (index_text.isascii() and index_text.isdigit()) or len(index_text) > 6:
            problems.add(f"{located(sample)}: gpu label {index_text[:20]!r} is not a GPU index")
            continue
        where_node = _gpu_node(sample.labels, node, label_node)
        series = gpus.setdefault((where_node, int(index_text)), _GpuSeries())
        uuid = next((sample.labels[n] for n in UUID_LABELS if sample.labels.get(n)), None)
        if uuid is not None:
            if series.uuid is None:
                series.uuid = uuid
            elif uuid != series.uuid:
                problems.add(
                    f"{located(sample)}: {where_node}/gpu{index_text} is {series.uuid}, "
                    f"this series says {uuid}; left out"
                )
                continue
        into = series.instance if sample.labels.get("GPU_I_ID") else series.device
        into.setdefault(sample.name, sample)
    messages: list[C4Model] = []
    for (gpu_node, index), series in sorted(gpus.items()):
        where = f"{gpu_node}/gpu{index}"
        fields = _gpu_fields(series, where, problems)
        xid = series.get(XID)
        seen: tuple[int, ...] = ()
        if xid is not None:
            value = _gpu_int(xid, where, problems)
            if value is not None:
                seen = xids.new(gpu_node, index, value)
        try:
            messages.append(
                Gpu(v=1, kind="gpu", node=gpu_node, gpu=index, ts_ns=ts_ns, xid=seen, **fields)
            )
        except ValidationError as error:
            problems.add(f"{where}: no message ({error.errors()[0]['msg']})")
    problems.close()
    return messages, lines
