"""Seeded randomness: one `random.Random` per purpose, so that adding a draw in one place
does not shift every other number of a run (and runs stay reproducible by seed)."""

from __future__ import annotations

import math
import random
import zlib


def stream(seed: int, *names: str) -> random.Random:
    """An independent generator for one purpose (``stream(seed, "job", "job-1")``)."""
    key = "/".join(names).encode()
    return random.Random((seed & 0xFFFFFFFFFFFF) * 2**32 + zlib.crc32(key))  # noqa: S311


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: exact for small means, the normal approximation for large ones."""
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, count, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count
