"""The demo's worker processes: started with their own environment and log file, stopped by pid.

Only processes this module started are ever signalled: SIGTERM first, SIGKILL after a grace.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from c4.demo import DemoError
from c4.stack import port_answers

STOP_GRACE_S = 20.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Child:
    """One ``c4 ...`` subprocess, its output in a log file."""

    def __init__(
        self, name: str, args: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path
    ) -> None:
        self.name = name
        self.log = log
        self._argv = [sys.executable, "-m", "c4.cli", *args]
        self._env = dict(env)
        self._cwd = cwd
        self._process = self._spawn("wb")

    def _spawn(self, mode: str) -> subprocess.Popen[bytes]:
        with self.log.open(mode) as out:
            return subprocess.Popen(  # noqa: S603 - our own interpreter and module
                self._argv,
                cwd=self._cwd,
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the demo reaches the demo, which stops us
            )

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._process.poll() is None

    def kill(self) -> None:
        """kill -9: no clean-up, no goodbye (a crash, for the chaos run)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait(30)

    def restart(self) -> None:
        """Start the same command again after it ended; its log goes on in the same file."""
        if self._process.poll() is None:
            message = f"{self.name} still runs (pid {self._process.pid}): not restarted"
            raise DemoError(message)
        self._process = self._spawn("ab")

    @property
    def pid(self) -> int:
        """The process id."""
        return self._process.pid

    def check(self) -> None:
        """Raise `DemoError` with the log's last line when the process has exited."""
        code = self._process.poll()
        if code is not None:
            lines = self.log.read_text(errors="replace").strip().splitlines()
            last = lines[-1] if lines else "(no output)"
            message = f"{self.name} exited {code}: {last} (log {self.log})"
            raise DemoError(message)

    def wait_port(self, port: int, timeout_s: float) -> None:
        """Wait until the process listens on ``port``, or raise `DemoError`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            if port_answers(port):
                return
            time.sleep(0.2)
        message = f"{self.name} did not open port {port} in {timeout_s:.0f} s (log {self.log})"
        raise DemoError(message)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a grace period; the exit code."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        return self._process.returncode
