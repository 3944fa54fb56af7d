"""Zero-code instrumentation: attach to a training process when it initialises torch.distributed.

With ``C4_INSTRUMENT=1`` (`c4 run` sets it), the ``c4-instrument.pth`` file the package
installs calls `activate` at interpreter start, in every Python process that inherits the
variable (torchrun's and ``mp.spawn``'s workers included). `activate` imports no torch: it
puts an import hook on ``sys.meta_path`` that waits for ``torch.distributed.distributed_c10d``
to be loaded and then wraps its ``init_process_group`` and ``destroy_process_group`` in
place, before ``torch.distributed`` and its submodules copy the names, so every way of
calling them goes through the wrappers; the hook then leaves ``sys.meta_path``.

When ``init_process_group`` returns, the rank writes one `Member` message (where it runs:
`producers.launch_env`) to its file in the handoff folder the node agent publishes from
(``c4 agent --handoff``), then `producers.torch_hooks.instrument` starts with the same sink.
Destroying the default group (and the interpreter's exit) closes the instrumentation, which
sends what it still holds; a later ``init_process_group`` starts it again.

Nothing here may stop the training: an unusable setting, an unwritable folder, a torch
without process-group hooks or any error in the hook is one line on stderr
(``c4: instrumentation off: <reason>``), once per process, and the training runs on as if
no hook were there (``init_process_group``'s own result and errors pass unchanged).
A process without torch (or torch.distributed) never loads c10d: nothing to instrument,
nothing said (`c4 run` says when its own Python has no torch).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from producers.launch_env import (
    LaunchIdentity,
    LaunchSettingError,
    enabled,
    handoff_dir,
    hostname,
    interval_s,
    resolve_identity,
    writer_name,
)

if TYPE_CHECKING:
    from schemas.messages import Member

TARGET = "torch.distributed.distributed_c10d"
OFF_PREFIX = "c4: instrumentation off: "
_lock = threading.Lock()


class _Off(Exception):
    """Why the instrumentation stays off, as one line."""


@dataclass(slots=True)
class _State:
    installed: bool = False
    patched: bool = False
    said_off: bool = False
    active: Any = None  # the running TorchInstrumentation
    pid: int = 0  # the process that started it (a forked child has none running)
    exit_hook: bool = False


_STATE = _State()


def activate(env: Mapping[str, str] | None = None) -> bool:
    """Arrange instrumentation for this process when ``C4_INSTRUMENT`` asks for it (the
    ``.pth`` hook's call); whether it is armed. Never raises."""
    env = os.environ if env is None else env
    if not enabled(env):
        return False
    try:
        # No look for torch here: a later .pth file may still add its folder to sys.path.
        # A process that never loads c10d has no process group to instrument.
        install()
    except Exception as error:  # noqa: BLE001 -- the training must start whatever happens here
        say_off(_describe(error))
        return False
    return True


def install() -> None:
    """Wrap ``init_process_group`` now if c10d is loaded, else as soon as it is."""
    with _lock:
        if _STATE.installed:
            return
        _STATE.installed = True
    module = sys.modules.get(TARGET)
    if module is not None:
        _patch_safely(module)
    else:
        sys.meta_path.insert(0, _PostImportFinder(TARGET, _patch_safely))


def say_off(reason: str) -> None:
    """The one stderr line saying the instrumentation is off, and why (once per process)."""
    with _lock:
        if _STATE.said_off:
            return
        _STATE.said_off = True
    try:
        print(OFF_PREFIX + _one_line(reason), file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001,S110 -- no stderr: nothing to say it on
        pass


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands ``name``'s spec found by the other finders back with a
    loader that calls ``then(module)`` once the module has run."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            spec.loader = _ThenLoader(loader, self.then)
        self.remove()
        return spec

    def remove(self) -> None:
        """Leave ``sys.meta_path`` (one module to watch, once)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _ThenLoader(importlib.abc.Loader):
    """``loader``, then ``then(module)``; the module keeps ``loader`` as its own."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _patch_safely(c10d: ModuleType) -> None:
    try:
        _patch(c10d)
    except Exception as error:  # noqa: BLE001 -- torch must import whatever happens here
        say_off(_describe(error))


def _patch(c10d: ModuleType) -> None:
    """Wrap c10d's ``init_process_group`` and ``destroy_process_group`` (and rebind the names
    others already took, when c10d was loaded before the hook)."""
    if _STATE.patched:
        return
    init, destroy = c10d.init_process_group, c10d.destroy_process_group

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        _after_init(c10d)
        return result

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs.get("group")
        if group is None or group is getattr(getattr(c10d, "GroupMember", None), "WORLD", None):
            close_active()
        return destroy(*args, **kwargs)

    init_process_group.__c4_wrapped__ = True  # type: ignore[attr-defined]
    replaced = {init: init_process_group, destroy: destroy_process_group}
    for name, module in list(sys.modules.items()):
        if module is not None and (name == TARGET or name.startswith("torch.distributed")):
            names = vars(module)  # no module __getattr__ run: nothing loaded by looking
            for attribute in ("init_process_group", "destroy_process_group"):
                current = names.get(attribute)
                if current is not None and current in replaced:
                    setattr(module, attribute, replaced[current])
    _STATE.patched = True


def _after_init(c10d: ModuleType) -> None:
    """The process group is up: report where this rank runs, start recording."""
    try:
        if _running() is None:
            _start(c10d, os.environ)
    except _Off as off:
        say_off(str(off))
    except Exception as error:  # noqa: BLE001 -- the training goes on, uninstrumented
        say_off(_describe(error))


def _running() -> Any:
    return _STATE.active if _STATE.active is not None and _STATE.pid == os.getpid() else None


def _start(c10d: ModuleType, env: Mapping[str, str]) -> None:
    from producers.handoff import FolderSink
    from producers.torch_hooks import InstrumentationError, instrument

    try:
        identity = resolve_identity(env, hostname())
        interval = interval_s(env)
    except LaunchSettingError as error:
        raise _Off(str(error)) from error
    identity, notes = identity.in_group(int(c10d.get_rank()), int(c10d.get_world_size()))
    job, rank, world_size = identity.job, identity.rank, identity.world_size
    if job is None:
        message = (
            "no job id: set C4_JOB (c4 run --job), or run under Slurm (SLURM_JOB_ID) "
            "or torchrun (--rdzv-id)"
        )
        raise _Off(message)
    assert rank is not None and world_size is not None  # noqa: S101 -- in_group set them
    gpu, gpu_uuid = gpu_of(identity.local_rank, env)
    member = member_message(identity, gpu, gpu_uuid)
    folder = handoff_dir(env)
    try:
        sink = FolderSink(folder, writer_name(job, rank))
    except OSError as error:
        message = f"cannot write to the handoff folder {folder}: {error.strerror or error}"
        raise _Off(message) from error
    try:
        sink([member])
    except OSError as error:
        sink.close()
        message = f"cannot write to the handoff folder {folder}: {error.strerror or error}"
        raise _Off(message) from error
    try:
        instrumentation = instrument(
            job,
            sink,
            interval_s=interval,
            node=identity.node,
            gpu=gpu if gpu is not None else identity.local_rank,
            restart=identity.restart,
        )
    except InstrumentationError as error:
        sink.close()
        raise _Off(str(error)) from error
    except BaseException:
        sink.close()
        raise
    _STATE.active, _STATE.pid = instrumentation, os.getpid()
    for note in notes:  # said once it runs: a failure is its one line alone
        print(f"c4: instrumentation: {_one_line(note)}", file=sys.stderr, flush=True)
    if not _STATE.exit_hook:
        _STATE.exit_hook = True
        atexit.register(close_active)


def member_message(identity: LaunchIdentity, gpu: int | None, gpu_uuid: str | None) -> Member:
    """The rank's `Member` message (a `_Off` when its values break the contract)."""
    from pydantic import ValidationError

    from schemas.messages import Member

    try:
        return Member(
            v=1,
            kind="member",
            job=identity.job,
            ts_ns=time.time_ns(),
            rank=identity.rank,
            world_size=identity.world_size,
            node=identity.node,
            host=identity.host,
            local_rank=identity.local_rank,
            gpu=gpu,
            gpu_uuid=gpu_uuid,
            port=identity.port,
            restart=identity.restart,
            job_nodes=identity.job_nodes,
            pod=identity.pod,
        )
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = "".join(f"{part}: " for part in first["loc"][:1])
        message = f"no valid member message: {where}{first['msg']}"
        raise _Off(message) from error


def close_active() -> None:
    """Stop the running instrumentation (it sends what it still holds); never raises."""
    instrumentation = _running()
    _STATE.active = None
    if instrumentation is None:
        return
    try:
        instrumentation.close()
    except Exception as error:  # noqa: BLE001 -- the training (or its exit) goes on
        print(f"c4: instrumentation: close failed: {_describe(error)}", file=sys.stderr)


def gpu_of(
    local_rank: int | None, env: Mapping[str, str], nvml: Any = None
) -> tuple[int | None, str | None]:
    """This rank's GPU on the node (index, NVML UUID); (None, None) without CUDA.

    The CUDA device is the current one when the process has initialised CUDA, else
    ``local_rank`` modulo the devices it sees (never initialising CUDA for it); its index on
    the node goes through ``CUDA_VISIBLE_DEVICES``.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    try:
        cuda = torch.cuda
        if not cuda.is_available():
            return None, None
        if cuda.is_initialized():
            index = int(cuda.current_device())
        elif local_rank is not None:
            index = local_rank % max(1, int(cuda.device_count()))
        else:
            return None, None
    except Exception:  # noqa: BLE001 -- a broken CUDA says nothing about where we run
        return None, None
    return node_gpu(index, env.get("CUDA_VISIBLE_DEVICES"), nvml)


def node_gpu(index: int, visible: str | None, nvml: Any = None) -> tuple[int | None, str | None]:
    """CUDA device ``index`` of a process that sees ``visible`` (``CUDA_VISIBLE_DEVICES``) as
    the node's GPU index and NVML UUID (None where it cannot tell). NVML (``pynvml``) is
    optional: without it, or without a driver, the UUID is None."""
    gpu: int | None = index
    wanted_uuid: str | None = None
    entries = [entry.strip() for entry in visible.split(",")] if visible else []
    if entries:
        if index >= len(entries):
            return None, None
        entry = entries[index]
        if entry.isascii() and entry.isdigit():
            gpu = int(entry)
        else:
            gpu, wanted_uuid = None, entry  # a UUID (or a prefix of one), or a MIG device
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return gpu, None
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 -- no driver: no UUID
        return gpu, None
    try:
        if gpu is not None:
            return gpu, _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(gpu)))
        for candidate in range(int(nvml.nvmlDeviceGetCount())):
            uuid = _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(candidate)))
            if wanted_uuid is not None and uuid.startswith(wanted_uuid):
                return candidate, uuid
        return None, None
    except Exception:  # noqa: BLE001 -- NVML errors: what is known so far
        return gpu, None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001,S110 -- nothing to do about it
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _one_line(text: str) -> str:
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )
