"""One group over every rank of the job (data parallelism: DDP, FSDP/ZeRO): the detectors'
answers on it, and the statistics that keep their cost linear in the group."""

from __future__ import annotations

import random
from statistics import median

from hypothesis import given
from hypothesis import strategies as st

from streams.core.stats import medians_of_others
from tests.unit.ring_job import RingJob
from tests.unit.test_detectors import diagnose


@given(st.lists(st.integers(min_value=-50, max_value=50), min_size=0, max_size=40))
def test_the_median_of_the_others_is_that_of_the_list_without_each(values: list[int]) -> None:
    floats = [float(v) for v in values]  # small integers: ties, odd and even lengths
    if len(floats) < 2:
        assert medians_of_others(floats) == []  # nobody else: no median
        return
    expected = [median(floats[:i] + floats[i + 1 :]) for i in range(len(floats))]
    assert medians_of_others(floats) == expected


def test_the_median_of_the_others_in_a_large_group() -> None:
    rng = random.Random(5)
    values = [rng.gauss(100.0, 3.0) for _ in range(1001)]
    values[321] = 500.0  # the slow one does not move its peers' median
    found = medians_of_others(values)
    for i in (0, 321, 500, 1000):
        assert found[i] == median(values[:i] + values[i + 1 :])


def test_a_straggler_in_one_group_over_512_ranks_is_named_and_no_other_rank() -> None:
    job = RingJob(n=512, ops=60, jitter=0.02, seed=3, slow_rank={300: (10, 1.2)})
    firing = [d for d in diagnose(job) if d.state == "firing"]
    assert [(d.class_, [s.id for s in d.suspects]) for d in firing] == [
        ("noncomm_slow", ["node-037/gpu4"])
    ]


def test_a_healthy_group_over_512_ranks_has_no_finding() -> None:
    job = RingJob(n=512, ops=60, jitter=0.03, seed=4)
    assert diagnose(job) == []
