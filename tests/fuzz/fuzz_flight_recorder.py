"""atheris harness: the Flight Recorder loader and converter on any bytes, guided by coverage.

Run: ``python tests/fuzz/fuzz_flight_recorder.py [libFuzzer flags] [CORPUS_DIR]``. The bytes
are unpickled by the restricted unpickler; anything but a dump or a `FlightRecorderError`,
a multi-line reason, or a converted message that is not valid v1 wire is a crash.
"""

from __future__ import annotations

import sys

import atheris

# Only our code is instrumented: instrumenting pydantic and the stdlib crashes atheris 2.3
# on Python 3.11 (a segfault at import), and their coverage is not what is fuzzed here.
with atheris.instrument_imports(include=["schemas", "producers"]):
    from producers.fr_convert import convert
    from producers.fr_dump import FlightRecorderError, RankDump, load_dump
    from schemas.codec import decode, encode

WRITTEN_NS = 1_800_000_000_000_000_000


def one_input(data: bytes) -> None:
    """Load the bytes as rank 0's dump and convert it."""
    try:
        dump = load_dump(data, "dump0")
    except FlightRecorderError as error:
        if "\n" in str(error):
            message = f"multi-line error: {error!r}"
            raise AssertionError(message) from None
        return
    conversion = convert([RankDump(0, WRITTEN_NS, dump, "dump0")], "job-1")
    for line in conversion.skipped:
        if "\n" in line:
            message = f"multi-line skip reason: {line!r}"
            raise AssertionError(message)
    for collective in conversion.messages:
        if decode(encode(collective)) != collective:
            message = f"converted message is not v1 wire: {collective!r}"
            raise AssertionError(message)


def main() -> None:
    """Hand the harness to libFuzzer with this process's argv."""
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
