"""Writing a command's output: a file, or stdout for ``-``."""

from __future__ import annotations

import sys


def write_output(target: str, data: bytes) -> int:
    """Write to a file, or stdout for ``-``; an unwritable file is a one-line error, exit 2."""
    if target == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        with open(target, "wb") as out:
            out.write(data)
    except OSError as error:
        print(f"c4: error: {error.strerror or error}: {target}", file=sys.stderr)
        return 2
    return 0
