"""One fault, one finding: the reports of a run the job has left (requeued, its pods
replaced) still in flight after the restart are that run's, never a new finding."""

from __future__ import annotations

from schemas.base import C4Model
from schemas.messages import Collective, Diagnosis, Member, Ops
from streams.core.engine import Engine
from streams.core.findings import FindingBook, SuspectScore
from tests.unit.ring_job import T0, RingJob, S

STUCK = RingJob(stuck_rank={11: 40})  # rank 11 never enters op 40: a hang at about 14 s
RESTART_AT = T0 + 20 * S  # the job is requeued after its hang fired


def moved(message: Collective, by_ns: int, restart: int | None) -> Collective:
    """The report ``by_ns`` later, of run ``restart``."""
    ops = message.ops
    return message.model_copy(
        update={
            "ts_ns": message.ts_ns + by_ns,
            "restart": restart,
            "ops": Ops(
                seq=ops.seq,
                op=ops.op,
                bytes=ops.bytes,
                enter_ns=tuple(t + by_ns for t in ops.enter_ns),
                end_ns=tuple(None if t is None else t + by_ns for t in ops.end_ns),
            ),
        }
    )


def members(job: RingJob, restart: int, ts_ns: int) -> list[Member]:
    return [
        Member(
            v=1,
            kind="member",
            job=job.job,
            ts_ns=ts_ns,
            rank=rank,
            world_size=job.n,
            node=job.place(rank)[0],
            gpu=job.place(rank)[1],
            port=job.place(rank)[2],
            restart=restart,
        )
        for rank in range(job.n)
    ]


def run(*, tagged: bool, member_reports: bool) -> list[Diagnosis]:
    """The stuck run, requeued at 20 s: the new, healthy run's reports (and, with
    ``member_reports``, its ranks' member reports) interleaved with the old run's last ones
    (still coming for 20 s more). ``tagged``: reports carry their run's ``restart``."""
    engine = Engine()
    out = []
    for message in requeued(tagged=tagged, member_reports=member_reports):
        out.extend(engine.process(message))
    out.extend(engine.check(engine.now_ns))
    return out


def requeued(*, tagged: bool, member_reports: bool) -> list[C4Model]:
    """The messages of `run`, in the order the engine takes them."""
    old = STUCK.messages()
    new = [moved(m, RESTART_AT - T0, 1 if tagged else None) for m in RingJob(seed=5).messages()]
    timeline: list[tuple[int, int, C4Model]] = []
    if member_reports:
        timeline += [(m.ts_ns, 0, m) for m in members(STUCK, 0, T0)]
        timeline += [(m.ts_ns, 0, m) for m in members(STUCK, 1, RESTART_AT)]
    timeline += [(m.ts_ns, 1, m.model_copy(update={"restart": 0 if tagged else None})) for m in old]
    timeline += [(m.ts_ns, 1, m) for m in new]
    ordered = sorted(timeline, key=lambda item: (item[0], item[1]))
    return [STUCK.job_message(), *(message for _, _, message in ordered)]


def hangs(out: list[Diagnosis]) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (d.id, d.state, tuple(s.id for s in d.suspects))
        for d in out
        if d.class_ in ("noncomm_hang", "comm_hang")
    ]


def test_the_old_runs_last_reports_fire_nothing_when_they_say_their_run() -> None:
    found = hangs(run(tagged=True, member_reports=True))
    first = found[0]
    assert first[1] == "firing" and first[2] == ("node-001/gpu3",)
    # Fired once, resolved once when the job restarted: nothing of the old run after that.
    assert [state for _, state, _ in found] == ["firing", "resolved"]


def test_reports_of_the_new_run_before_its_member_reports_end_the_old_run() -> None:
    # No member reports at all (an agent of its own): the reports' restart alone tells.
    found = hangs(run(tagged=True, member_reports=False))
    assert [state for _, state, _ in found] == ["firing", "resolved"]


def test_untagged_reports_of_the_old_run_are_the_same_finding_not_a_new_one() -> None:
    # Reports that do not say their run (another producer, a converted trace), stamped after
    # the new run's first member report: the old run's stopped rank is seen again. It is the
    # finding that fired before the restart, with its id: no second action for one fault.
    found = hangs(run(tagged=False, member_reports=True))
    assert found, "the stopped rank's hang"
    assert {fid for fid, _, _ in found} == {found[0][0]}
    assert all(suspects == ("node-001/gpu3",) for _, _, suspects in found)


def test_a_hang_that_resolves_and_comes_back_on_the_same_ranks_keeps_its_id() -> None:
    book = FindingBook()
    suspects = (SuspectScore("gpu", "node-001/gpu3", 0.95),)
    first = book.fire("job-1", "noncomm_hang", "hang", 10 * S, 15 * S, suspects, {})
    assert first is not None
    book.resolve("job-1", "noncomm_hang", "hang", 20 * S)
    again = book.fire("job-1", "noncomm_hang", "hang", 22 * S, 27 * S, suspects, {})
    assert again is not None and (again.id, again.onset_ns) == (first.id, first.onset_ns)
    # Other ranks, or long after: a new finding.
    book.resolve("job-1", "noncomm_hang", "hang", 30 * S)
    other = (SuspectScore("gpu", "node-002/gpu0", 0.95),)
    new = book.fire("job-1", "noncomm_hang", "hang", 31 * S, 36 * S, other, {})
    assert new is not None and new.id != first.id
    book.resolve("job-1", "noncomm_hang", "hang", 40 * S)
    late = book.fire("job-1", "noncomm_hang", "hang", 200 * S, 205 * S, other, {})
    assert late is not None and late.id != new.id
