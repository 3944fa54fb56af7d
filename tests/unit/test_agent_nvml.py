"""NVML -> v1 gpu messages, through a fake ``pynvml`` module object (no GPU on this machine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from producers.agent import Agent
from producers.nvml import NvmlSource, throttle_names
from schemas.base import C4Model
from schemas.messages import Gpu

T0 = 1_800_000_000_000_000_000


class NVMLError(Exception):
    """pynvml's error: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Event:
    device: Any
    eventType: int  # noqa: N815 -- pynvml's field name
    eventData: int  # noqa: N815


@dataclass
class FakeDevice:
    index: int
    temp: int = 60
    power_mw: int = 450_000
    sm_mhz: int = 1980
    ecc_dbe: int = 0
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    retired: dict[int, list[int]] = field(default_factory=dict)
    reasons: int = 0
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    links: int = 0


class FakeNvml:
    """The part of pynvml's API the source uses, with pynvml's names and constants."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_ERROR_DL_REPLAY = 0
    NVML_NVLINK_ERROR_DL_RECOVERY = 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
    NVML_NVLINK_ERROR_DL_CRC_DATA = 3
    nvmlEventTypeXidCriticalError = 8  # noqa: N815

    def __init__(self, devices: list[FakeDevice], init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.events: list[Event] = []
        self.registered: list[int] = []
        self.shut_down = False

    def nvmlInit(self) -> None:  # noqa: N802
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:  # noqa: N802
        return self.devices[index]

    def nvmlDeviceGetIndex(self, handle: FakeDevice) -> int:  # noqa: N802
        return handle.index

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "event-set"

    def nvmlEventSetFree(self, events: str) -> None:  # noqa: N802
        assert events == "event-set"

    def nvmlDeviceRegisterEvents(self, handle: FakeDevice, types: int, events: str) -> None:  # noqa: N802
        assert types == self.nvmlEventTypeXidCriticalError and events == "event-set"
        self.registered.append(handle.index)

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Event:  # noqa: N802
        assert timeout_ms == 0  # never blocks the agent
        if not self.events:
            raise NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> int:  # noqa: N802
        return handle.temp

    def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:  # noqa: N802
        return handle.power_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeDevice, clock: int) -> int:  # noqa: N802
        return handle.sm_mhz

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeDevice, kind: int, counter: int) -> int:  # noqa: N802
        assert (kind, counter) == (1, 0)
        return handle.ecc_dbe

    def nvmlDeviceGetRemappedRows(self, handle: FakeDevice) -> tuple[int, int, int, int]:  # noqa: N802
        if handle.remapped is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return handle.remapped

    def nvmlDeviceGetRetiredPages(self, handle: FakeDevice, cause: int) -> list[int]:  # noqa: N802
        return handle.retired.get(cause, [])

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeDevice) -> int:  # noqa: N802
        return handle.reasons

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeDevice, link: int, counter: int) -> int:  # noqa: N802
        if link >= handle.links:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return handle.nvlink_errors.get((link, counter), 0)


def gpus(source: NvmlSource) -> tuple[list[Gpu], list[str]]:
    reading = source.read(T0)
    return [m for m in reading.messages if isinstance(m, Gpu)], reading.problems


def test_xid_events_ecc_pages_throttle_and_nvlink_map_to_gpu_messages() -> None:
    healthy = FakeDevice(0, links=4)
    sick = FakeDevice(
        1,
        temp=91,
        power_mw=612_500,
        sm_mhz=1410,
        ecc_dbe=2,
        remapped=(3, 1, 0, 0),
        reasons=0x8 | 0x40 | 0x1,
        nvlink_errors={(2, 3): 5, (3, 0): 1},
        links=4,
    )
    old = FakeDevice(2, remapped=None, retired={0: [1, 2], 1: [7]}, reasons=0x4)
    nvml = FakeNvml([healthy, sick, old])
    source = NvmlSource("node-004", nvml=nvml)

    nvml.events = [Event(sick, 8, 79), Event(sick, 8, 48), Event(old, 8, 13)]
    messages, problems = gpus(source)
    assert problems == []
    assert nvml.registered == [0, 1, 2]
    by_gpu = {m.gpu: m for m in messages}
    assert by_gpu[0].xid == () and by_gpu[0].throttle == () and by_gpu[0].nvlink_err == 0
    assert by_gpu[1].xid == (79, 48)
    assert (by_gpu[1].temp_c, by_gpu[1].power_w, by_gpu[1].sm_mhz) == (91.0, 612.5, 1410.0)
    assert by_gpu[1].ecc_dbe == 2 and by_gpu[1].retired_pages == 4
    assert by_gpu[1].throttle == ("hw_slowdown", "hw_thermal")  # idle is not a throttle
    assert by_gpu[1].nvlink_err == 6
    assert by_gpu[2].xid == (13,)
    assert by_gpu[2].retired_pages == 3  # no row remapping: retired pages instead
    assert by_gpu[2].throttle == ("sw_power_cap",) and by_gpu[2].nvlink_err is None
    assert {m.node for m in messages} == {"node-004"}

    # XIDs are those seen since the previous message.
    messages, _ = gpus(source)
    assert all(m.xid == () for m in messages)
    source.close()
    assert nvml.shut_down


def test_a_field_that_fails_is_a_problem_and_left_out() -> None:
    class Flaky(FakeNvml):
        def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:  # noqa: N802
            raise NVMLError(15)  # GPU is lost

    source = NvmlSource("node-004", nvml=Flaky([FakeDevice(0)]))
    messages, problems = gpus(source)
    assert messages[0].power_w is None and messages[0].temp_c == 60.0
    assert problems == ["gpu0 power_w: NVML error 15"]


def test_no_library_or_no_gpu_is_reported_once_and_the_agent_goes_on() -> None:
    reports: list[str] = []
    sent: list[C4Model] = []
    missing_driver = NvmlSource("n", nvml=FakeNvml([], init_error=12))
    no_gpu = NvmlSource("n", nvml=FakeNvml([]))
    working = NvmlSource("n", nvml=FakeNvml([FakeDevice(0)]))
    agent = Agent([missing_driver, no_gpu, working], sent.append, reports.append)
    agent.run_once()
    agent.run_once()
    assert reports == [
        "source nvml: unavailable (NVML: NVML error 12); the agent goes on",
        "source nvml: unavailable (NVML sees no GPU); the agent goes on",
    ]
    assert len(sent) == 2 and agent.active == ["nvml"]


def test_throttle_names() -> None:
    assert throttle_names(0) == ()
    assert throttle_names(0x1FF) == (
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal",
        "hw_thermal",
        "hw_power_brake",
    )
