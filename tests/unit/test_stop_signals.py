"""The long-running commands stop alike on SIGTERM and SIGINT: an Event, then an orderly exit."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from c4.stopping import stop_on_signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_sets_the_event_and_the_handlers_are_put_back(signum: int) -> None:
    before = {each: signal.getsignal(each) for each in (signal.SIGTERM, signal.SIGINT)}
    with stop_on_signals() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signum)
        deadline = time.monotonic() + 5
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler runs in the main thread, between instructions
        assert stop.is_set()
    assert {each: signal.getsignal(each) for each in before} == before


def test_the_commands_install_no_handlers_of_their_own() -> None:
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "c4").glob("*_cmd.py")):
        assert "signal.signal(" not in path.read_text(encoding="utf-8"), path
