"""Started by ``c4-instrument.pth`` (installed into site-packages beside this module) when
``C4_INSTRUMENT`` is set: arm c4's torch instrumentation for this Python process.

The ``.pth`` line imports this module only when the variable is set, so an interpreter
without it imports nothing of c4 (and no torch). Here: the switch's value (``0``, ``false``,
``no``, ``off`` or empty: off), then `producers.autoinstrument.activate`, which only puts an
import hook in place; any failure is one stderr line and the process goes on.
"""

from __future__ import annotations

import os
import sys

PTH_NAME = "c4-instrument.pth"
# The whole .pth file: site runs a line that starts with "import"; the check keeps every
# interpreter without C4_INSTRUMENT from even looking for this module.
PTH_LINE = "import os; 'C4_INSTRUMENT' in os.environ and __import__('c4_autoinstrument').run()"


def run() -> None:
    """Arm the instrumentation when ``C4_INSTRUMENT`` asks for it; never raises."""
    if os.environ.get("C4_INSTRUMENT", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    try:
        from producers.autoinstrument import activate

        activate()
    except Exception as error:  # noqa: BLE001 -- the process must start whatever happens
        print(f"c4: instrumentation off: {type(error).__name__}: {error}", file=sys.stderr)
