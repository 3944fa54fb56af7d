"""GPU health from NVML (nvidia-ml-py's ``pynvml`` module), as v1 gpu messages.

XID errors come from an NVML event set, drained without blocking every round; ECC
double-bit errors, retired pages / remapped rows, clock event (throttle) reasons, NVLink
error counters, temperature, power and SM clock are read per GPU. A field the GPU does not
support is left out; any other error on a field is a problem line and the field is left out.
No library, no driver or no GPU: `SourceUnavailable`, once. The module object can be
injected (tests give a fake one; there is no GPU on the build machines).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from producers.sources import Reading, SourceUnavailable
from schemas.messages import Gpu

# Clock event reason bits (nvmlClocksEventReason*) -> the names sent in ``throttle``.
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# Reasons that are not a problem (an idle GPU, clocks the user chose).
BENIGN_THROTTLE = 0x1 | 0x2 | 0x100
NVLINK_ERROR_COUNTERS = (
    "NVML_NVLINK_ERROR_DL_REPLAY",
    "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "NVML_NVLINK_ERROR_DL_CRC_DATA",
)
MAX_EVENTS_PER_ROUND = 1_000


def throttle_names(mask: int) -> tuple[str, ...]:
    """The non-benign clock event reasons set in ``mask``."""
    return tuple(
        name for bit, name in THROTTLE_BITS.items() if mask & bit and not bit & BENIGN_THROTTLE
    )


class NvmlSource:
    """One gpu message per GPU per round."""

    def __init__(self, node: str, interval_s: float = 5.0, nvml: Any = None) -> None:
        self.name = "nvml"
        self.interval_s = interval_s
        self.node = node
        self._nvml = nvml
        self._handles: list[Any] = []
        self._events: Any = None
        self._started = False

    def _start(self) -> None:
        nv = self._nvml
        if nv is None:
            try:
                nv = importlib.import_module("pynvml")
            except ImportError as error:
                message = f"pynvml is not installed ({error})"
                raise SourceUnavailable(message) from error
        try:
            nv.nvmlInit()
            count = int(nv.nvmlDeviceGetCount())
            handles = [nv.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        except nv.NVMLError as error:
            message = f"NVML: {error}"
            raise SourceUnavailable(message) from error
        if not handles:
            message = "NVML sees no GPU"
            raise SourceUnavailable(message)
        self._nvml, self._handles = nv, handles
        self._started = True
        try:
            events = nv.nvmlEventSetCreate()
            for handle in handles:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
            self._events = events
        except nv.NVMLError:
            self._events = None  # reported by read(): no XIDs from this node

    def read(self, now_ns: int) -> Reading:
        """Drain XID events, then read every GPU."""
        if not self._started:
            self._start()
        reading = Reading()
        xids: dict[int, list[int]] = {}
        if self._events is None:
            reading.problems.append("XID events cannot be registered; no XIDs from this node")
        else:
            self._drain_events(xids, reading.problems)
        getters = self._getters()
        for index, handle in enumerate(self._handles):
            fields: dict[str, Any] = {}
            for name, getter in getters.items():
                self._field(fields, name, reading, index, getter, handle)
            reading.messages.append(
                Gpu(
                    v=1,
                    kind="gpu",
                    node=self.node,
                    gpu=index,
                    ts_ns=now_ns,
                    xid=tuple(xids.get(index, ())),
                    **fields,
                )
            )
        return reading

    def _getters(self) -> dict[str, Callable[[Any], Any]]:
        """How each optional field of the gpu message is read from one device handle."""
        nv = self._nvml
        return {
            "temp_c": lambda h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "power_w": lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,  # milliwatts
            "sm_mhz": lambda h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "ecc_dbe": lambda h: int(
                nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                )
            ),
            "retired_pages": self._retired,
            "throttle": lambda h: throttle_names(int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))),
            "nvlink_err": self._nvlink_errors,
        }

    def _drain_events(self, xids: dict[int, list[int]], problems: list[str]) -> None:
        nv = self._nvml
        for _ in range(MAX_EVENTS_PER_ROUND):
            try:
                event = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError as error:
                if getattr(error, "value", None) != nv.NVML_ERROR_TIMEOUT:
                    problems.append(f"XID event wait: {error}")
                return
            if event.eventType != nv.nvmlEventTypeXidCriticalError:
                continue
            index = self._index_of(event.device)
            if index is None:
                problems.append(f"XID {event.eventData} from an unknown device")
                continue
            xids.setdefault(index, []).append(int(event.eventData))

    def _index_of(self, device: Any) -> int | None:
        for index, handle in enumerate(self._handles):
            if handle == device:
                return index
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except self._nvml.NVMLError:
            return None

    def _field(
        self,
        fields: dict[str, Any],
        name: str,
        reading: Reading,
        index: int,
        getter: Callable[[Any], Any],
        handle: Any,
    ) -> None:
        nv = self._nvml
        try:
            value = getter(handle)
        except nv.NVMLError as error:
            if getattr(error, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                reading.problems.append(f"gpu{index} {name}: {error}")
            return
        if value is not None:
            fields[name] = value

    def _retired(self, handle: Any) -> int:
        """Remapped rows on GPUs that remap (A100 and later), else retired pages."""
        nv = self._nvml
        try:
            corrected, uncorrected, _pending, _failed = nv.nvmlDeviceGetRemappedRows(handle)
            return int(corrected) + int(uncorrected)
        except nv.NVMLError as error:
            if getattr(error, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                raise
        pages = 0
        for cause in (
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            pages += len(nv.nvmlDeviceGetRetiredPages(handle, cause))
        return pages

    def _nvlink_errors(self, handle: Any) -> int | None:
        """Sum of the DL error counters over the GPU's NVLinks; None without NVLink."""
        nv = self._nvml
        total, links = 0, 0
        for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
            try:
                for counter in NVLINK_ERROR_COUNTERS:
                    code = getattr(nv, counter)
                    total += int(nv.nvmlDeviceGetNvLinkErrorCounter(handle, link, code))
            except nv.NVMLError as error:
                code = getattr(error, "value", None)
                if code in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                    continue  # this link does not exist on this GPU
                raise
            links += 1
        return total if links else None

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        if not self._started:
            return
        nv = self._nvml
        try:
            if self._events is not None:
                nv.nvmlEventSetFree(self._events)
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self._started = False
