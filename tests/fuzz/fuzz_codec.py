"""atheris harness: the v1 codec's decode on any bytes, guided by coverage.

Run: ``python tests/fuzz/fuzz_codec.py [libFuzzer flags] [CORPUS_DIR]`` (e.g.
``-max_total_time=60``). Any exception, a rejection that is not typed and one line, or an
accepted message that does not encode back to itself is a crash (a ``crash-*`` file).
"""

from __future__ import annotations

import sys

import atheris

# Only our code is instrumented: instrumenting pydantic and the stdlib crashes atheris 2.3
# on Python 3.11 (a segfault at import), and their coverage is not what is fuzzed here.
with atheris.instrument_imports(include=["schemas", "producers"]):
    from schemas.codec import KINDS, RejectCode, Rejection, decode, encode


def one_input(data: bytes) -> None:
    """Decode as whatever kind the document says, and as the kind its first byte picks."""
    expected = KINDS[data[0] % len(KINDS)] if data else None
    for kind in (None, expected):
        result = decode(data, kind)
        if isinstance(result, Rejection):
            if not isinstance(result.code, RejectCode) or "\n" in result.reason:
                message = f"untyped or multi-line rejection: {result!r}"
                raise AssertionError(message)
            continue
        if decode(encode(result)) != result:
            message = f"accepted message does not round-trip: {result!r}"
            raise AssertionError(message)


def main() -> None:
    """Hand the harness to libFuzzer with this process's argv."""
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
