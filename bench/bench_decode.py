"""Decode cost of the hot kinds: the models' validation against the msgspec fast path.

Messages of a recorded 3D-parallel MoE job (`bench_replay.scenario`): its collective and
link lines, decoded by
- ``pydantic``: `orjson.loads` and the model's `model_validate` (the decoder before the
  fast path, still the one that says why a document is rejected);
- ``fast path``: `schemas.codec.decode` as it is (`schemas.fastpath`: msgspec, the
  contract's rules, the model assembled);
- for reference, what parsing alone costs: ``orjson.loads`` to dicts, and msgspec's
  decoder of the fast path to its Structs (types and bounds checked, no rules, no model).
Prints messages/s, operations/s and µs per message (medians of ``--repeats``), and the
speed of each against pydantic.

    python bench/bench_decode.py [--nodes 8] [--duration-s 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_replay import simulate  # noqa: E402

from schemas.codec import MODELS, decode  # noqa: E402
from schemas.fastpath import _DECODER  # noqa: E402


def pydantic_decode(line: bytes) -> Any:
    obj = orjson.loads(line)
    return MODELS[obj["kind"]].model_validate(obj)


def timed(decoder: Callable[[bytes], Any], lines: list[bytes]) -> float:
    started = time.perf_counter()
    for line in lines:
        decoder(line)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="c4-bench-decode-") as tmp:
        recorded, _, _ = simulate(Path(tmp), args.nodes, args.duration_s)
        lines = [
            line
            for line in recorded.read_bytes().splitlines()
            if b'"kind":"collective"' in line or b'"kind":"link"' in line
        ]
    operations = sum(len(orjson.loads(line).get("ops", {}).get("seq", ())) for line in lines)
    collectives = sum(1 for line in lines if b'"kind":"collective"' in line)
    decoders: dict[str, Callable[[bytes], Any]] = {
        "pydantic": pydantic_decode,
        "fast path": decode,
        "orjson.loads": orjson.loads,
        "msgspec parse": _DECODER.decode,
    }
    for line in lines:  # both decoders agree on every line before anything is timed
        if decode(line) != pydantic_decode(line):
            message = f"the decoders differ on {line[:120]!r}"
            raise RuntimeError(message)
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(args.repeats):
        for name, decoder in decoders.items():
            times[name].append(timed(decoder, lines))
    print(
        f"{len(lines):,} lines ({collectives:,} collective, {len(lines) - collectives:,} link), "
        f"{operations:,} operations ({operations / max(collectives, 1):.1f} per collective); "
        f"{args.repeats} runs each"
    )
    print(f"{'decoder':<15}{'messages/s':>12}{'ops/s':>14}{'us/message':>12}{'vs pydantic':>13}")
    base = statistics.median(times["pydantic"])
    for name, runs in times.items():
        seconds = statistics.median(runs)
        print(
            f"{name:<15}{len(lines) / seconds:>12,.0f}{operations / seconds:>14,.0f}"
            f"{seconds / len(lines) * 1e6:>12.2f}{base / seconds:>12.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
