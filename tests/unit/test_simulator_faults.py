"""What each injected fault does to the simulated messages (no timing thresholds)."""

from __future__ import annotations

from collections import Counter
from statistics import median

import pytest

from schemas.messages import Collective, Gpu, Link
from simulator import ScenarioError, ground_truth, scenario_from
from simulator.cluster import build_cluster
from tests.unit.test_simulator import T0, S, case, collectives, durations, run


def _last_entrant(per_seq: dict[int, dict[int, int]], size: int) -> Counter[int]:
    """How often each rank had the shortest duration (entered last) of a complete op."""
    return Counter(min(d, key=d.__getitem__) for d in per_seq.values() if len(d) == size)


def test_slow_gpu_enters_last_so_its_duration_is_the_shortest() -> None:
    fault = {"type": "slow_gpu", "job": "job-2", "rank": 11, "factor": 1.2, "at_s": 5}
    _, messages = run(case(fault))
    per_seq = durations(messages, "job-2", 16)
    onset_seq = min(
        seq
        for m in collectives(messages, "job-2")
        for seq, enter in zip(m.ops.seq, m.ops.enter_ns, strict=True)
        if enter > T0 + 6 * S
    )
    after = {seq: d for seq, d in per_seq.items() if seq >= onset_seq}
    last = _last_entrant(after, 16)
    assert last.most_common(1)[0][0] == 11
    assert last[11] > 0.8 * sum(last.values())
    before = _last_entrant({s: d for s, d in per_seq.items() if s < onset_seq - 2}, 16)
    assert before[11] < 0.5 * sum(before.values())  # before the onset: no one in particular


def test_slow_gpu_in_a_tensor_parallel_job_lags_in_its_group_and_in_dp() -> None:
    fault = {"type": "slow_gpu", "job": "job-1", "rank": 13, "factor": 1.3, "at_s": 0}
    _, messages = run(case(fault))
    dp = _last_entrant(durations(messages, "job-1", 32), 32)
    assert dp.most_common(1)[0][0] == 13
    group = [m for m in collectives(messages, "job-1") if m.comm_size == 8 and m.node == "node-001"]
    per_seq: dict[int, dict[int, int]] = {}
    for m in group:
        for seq, enter, end in zip(m.ops.seq, m.ops.enter_ns, m.ops.end_ns, strict=True):
            if end is not None:
                per_seq.setdefault(seq, {})[m.rank] = end - enter
    assert _last_entrant(per_seq, 8).most_common(1)[0][0] == 13 % 8


def test_process_stuck_keeps_heartbeating_and_never_enters() -> None:
    fault = {"type": "process_stuck", "job": "job-2", "rank": 5, "at_s": 10}
    _, messages = run(case(fault))
    mine = [m for m in collectives(messages, "job-2") if m.global_rank == 5]
    assert max(m.ts_ns for m in mine) > T0 + 28 * S  # still alive at the end
    entered = [e for m in mine for e in m.ops.enter_ns]
    assert max(entered) <= T0 + 10 * S + 10_000_000
    late = [m for m in mine if m.ts_ns > T0 + 12 * S]
    assert late and all(len(m.ops) == 0 for m in late)  # heartbeats only
    mine_seqs = {s for m in mine for s in m.ops.seq}
    others = {s for m in collectives(messages, "job-2") if m.global_rank != 5 for s in m.ops.seq}
    waiting = others - mine_seqs
    assert len(waiting) == 1  # the others entered the next op and wait in it for ever
    (seq,) = waiting
    ends = [
        end
        for m in collectives(messages, "job-2")
        for s, end in zip(m.ops.seq, m.ops.end_ns, strict=True)
        if s == seq
    ]
    assert len(ends) == 15 and all(end is None for end in ends)


def test_gpu_stop_reports_xid_79_then_only_heartbeats() -> None:
    fault = {"type": "gpu_stop", "job": "job-1", "rank": 20, "at_s": 12}
    _, messages = run(case(fault))
    gpus = [m for m in messages if isinstance(m, Gpu) and m.node == "node-002" and m.gpu == 4]
    after = [m for m in gpus if m.ts_ns >= T0 + 12 * S]
    assert after[0].xid == (79,)
    assert all(m.xid == () and m.temp_c is None for m in after[1:])
    assert all(79 not in m.xid for m in gpus if m.ts_ns < T0 + 12 * S)
    healthy = [m for m in messages if isinstance(m, Gpu) and m.node == "node-002" and m.gpu == 3]
    assert all(m.temp_c is not None for m in healthy)
    mine = [m for m in collectives(messages, "job-1") if m.global_rank == 20]
    assert max(m.ts_ns for m in mine) > T0 + 28 * S
    assert max(e for m in mine for e in m.ops.enter_ns) <= T0 + 12 * S + 10_000_000


def test_node_down_silences_the_node_and_only_it() -> None:
    fault = {"type": "node_down", "node": "node-002", "at_s": 15}
    _, messages = run(case(fault))
    onset = T0 + 15 * S
    reports = [m for m in messages if isinstance(m, Collective | Link | Gpu)]
    from_node = [m for m in reports if m.node == "node-002"]
    assert {type(m) for m in from_node} == {Collective, Link, Gpu}
    assert max(m.ts_ns for m in from_node) <= onset + 10_000_000  # clocks a few ms apart
    assert min(m.ts_ns for m in from_node) < onset
    for node in ("node-000", "node-003", "node-004"):
        assert max(m.ts_ns for m in reports if m.node == node) > T0 + 28 * S
    # The job's other ranks stay alive, waiting: heartbeats and no more completions.
    rest = [m for m in collectives(messages, "job-1") if m.ts_ns > onset + 2 * S]
    assert rest and all(end is None for m in rest for end in m.ops.end_ns)


def test_link_down_marks_the_port_and_hangs_the_ring() -> None:
    fault = {"type": "link_down", "node": "node-004", "port": "mlx5_3:1", "at_s": 14}
    _, messages = run(case(fault))
    onset = T0 + 14 * S
    port = [m for m in messages if isinstance(m, Link) and m.node == "node-004"]
    bad = [m for m in port if m.port == "mlx5_3:1"]
    before = [m for m in bad if m.ts_ns < onset - 10_000_000]
    after = [m for m in bad if m.ts_ns > onset + 10_000_000]
    assert all(m.state == "up" for m in before) and all(m.state == "down" for m in after)
    assert after[0].counters.link_down == (before[-1].counters.link_down or 0) + 1
    assert after[0].counters.tx_bytes == after[-1].counters.tx_bytes  # nothing moves
    assert all(m.state == "up" for m in port if m.port != "mlx5_3:1")
    job = collectives(messages, "job-2")
    hung = {s for m in job for s, e in zip(m.ops.seq, m.ops.end_ns, strict=True) if e is None}
    done = {s for m in job for s, e in zip(m.ops.seq, m.ops.end_ns, strict=True) if e is not None}
    stuck = hung - done
    assert len(stuck) == 1  # every member entered it; none finishes
    (seq,) = stuck
    entered = {m.rank for m in job for s in m.ops.seq if s == seq}
    assert entered == set(range(16))
    # The dead port's connections have data stuck in flight; the others wait idle.
    late = [m for m in job if m.ts_ns > onset + 3 * S and m.conns is not None]
    stalled = {m.rank for m in late if m.conns and max(m.conns.busy_ns) > 0}
    # Rank 3 is node-004's GPU 3; its ring neighbours are GPU 3 of the other node (rank 11,
    # which it sends to) and rank 10 (which sends to it): the ring goes rail by rail.
    assert stalled == {3, 10, 11}
    assert all(m.conns is not None and sum(m.conns.bytes) == 0 for m in late)
    others = collectives(messages, "job-1")
    assert any(e is not None and e > onset + 5 * S for m in others for e in m.ops.end_ns)


def test_port_degraded_slows_its_connections_and_raises_symbol_errors() -> None:
    fault = {"type": "port_degraded", "node": "node-005", "port": "mlx5_6:1", "factor": 0.4}
    _, messages = run(case(fault | {"at_s": 12}))
    onset = T0 + 12 * S
    errors = [
        m.counters.symbol_err or 0
        for m in messages
        if isinstance(m, Link) and m.node == "node-005" and m.port == "mlx5_6:1"
    ]
    assert errors[-1] > errors[len(errors) // 2] > errors[0]
    rank = 8 + 6  # node-005 is job-2's second node

    def throughput(ranks: set[int], after: bool) -> float:
        rates = [
            8 * m.conns.bytes[0] / m.conns.busy_ns[0]
            for m in collectives(messages, "job-2")
            if m.conns is not None
            and m.rank in ranks
            and m.conns.busy_ns[0] > 0
            and (m.ts_ns > onset + S) == after
        ]
        return median(rates)

    assert throughput({rank}, True) < 0.5 * throughput({rank}, False)
    assert throughput({0, 1, 2}, True) > 0.9 * throughput({0, 1, 2}, False)
    shortest = {seq: min(d.values()) for seq, d in durations(messages, "job-2", 16).items()}
    seqs = sorted(shortest)
    early, late = seqs[5 : len(seqs) // 3], seqs[-20:-2]
    assert median(shortest[s] for s in late) > 1.5 * median(shortest[s] for s in early)


def test_fabric_link_degraded_slows_the_jobs_crossing_it() -> None:
    # Two nodes per leaf: job-1 (node-000..003) spans two leaves, job-2 (node-004, 005) one.
    document = case()
    document["fabric"] = {"nodes_per_leaf": 2, "spines": 2}
    cluster = build_cluster(None, scenario_from(document))
    crossing = {
        job.spec.id: {link for comm in job.comms for conn in comm.ring or () for link in conn.links}
        for job in cluster.jobs
    }
    link = sorted(crossing["job-1"] - crossing["job-2"])[0]
    document["faults"] = [{"type": "fabric_link_degraded", "link": link, "factor": 0.3, "at_s": 10}]
    _, messages = run(document)

    def slowdown(job: str, size: int) -> float:
        shortest = {seq: min(d.values()) for seq, d in durations(messages, job, size).items()}
        seqs = sorted(shortest)
        early, late = seqs[3 : len(seqs) // 4], seqs[-15:-2]
        return median(shortest[s] for s in late) / median(shortest[s] for s in early)

    assert slowdown("job-1", 32) > 2
    assert slowdown("job-2", 16) < 1.2
    receivers = [
        m.counters.out_of_seq or 0
        for m in messages
        if isinstance(m, Link) and m.ts_ns > T0 + 12 * S
    ]
    assert max(receivers) > 0  # lost packets show up at the receiving NICs


def test_fabric_link_down_makes_the_connections_over_it_crawl() -> None:
    document = case()
    document["fabric"] = {"nodes_per_leaf": 2, "spines": 2}
    cluster = build_cluster(None, scenario_from(document))
    crossing = {
        job.spec.id: {link for comm in job.comms for conn in comm.ring or () for link in conn.links}
        for job in cluster.jobs
    }
    link = sorted(crossing["job-1"] - crossing["job-2"])[0]
    document["faults"] = [{"type": "fabric_link_down", "link": link, "at_s": 10}]
    scenario, messages = run(document)
    truth = ground_truth(None, scenario)

    def slowdown(job: str, size: int) -> float:
        shortest = {seq: min(d.values()) for seq, d in durations(messages, job, size).items()}
        seqs = sorted(shortest)
        early, late = seqs[3 : len(seqs) // 4], seqs[-15:-2]
        return median(shortest[s] for s in late) / median(shortest[s] for s in early)

    # A dark link slows its connections more than any degraded one above: they crawl.
    assert slowdown("job-1", 32) > 3
    assert slowdown("job-2", 16) < 1.2
    assert [(t.type, t.suspect_type, t.suspect_id) for t in truth] == [
        ("fabric_link_down", "link", link)
    ]
    assert truth[0].classes == ("link_down", "link_degraded")


def test_a_path_change_takes_a_connection_off_a_dark_link() -> None:
    document = case()
    document["fabric"] = {"nodes_per_leaf": 2, "spines": 2}
    cluster = build_cluster(None, scenario_from(document))
    job = cluster.job("job-1")
    dp = job.comms[0]
    crossing = [conn for conn in dp.ring or () if conn.links]
    link = crossing[0].links[0]
    over = [c for c in crossing if link in c.links]
    document["faults"] = [{"type": "fabric_link_down", "link": link, "at_s": 5}]
    spines = {"spine-a-0", "spine-a-1"}
    document["path_changes"] = [
        {"at_s": 15, "flow": f"job-1/{dp.id}/{c.src}->{c.dst}", "via": (spines - {c.via}).pop()}
        for c in over
    ]
    _, messages = run(document)
    shortest = {seq: min(d.values()) for seq, d in durations(messages, "job-1", 32).items()}
    by_enter: dict[int, int] = {}
    for m in collectives(messages, "job-1"):
        if m.comm_size == 32:
            for seq, enter in zip(m.ops.seq, m.ops.enter_ns, strict=True):
                by_enter[seq] = min(by_enter.get(seq, enter), enter)

    def typical(lo_s: float, hi_s: float) -> float:
        seqs = [s for s, t in by_enter.items() if T0 + lo_s * S < t < T0 + hi_s * S]
        return median(shortest[s] for s in seqs if s in shortest)

    before, dark, after = typical(1, 4), typical(7, 14), typical(17, 28)
    assert dark > 3 * before  # crawling over the dark link
    assert after < 1.2 * before  # rerouted: back to speed


def test_fabric_link_down_names_a_known_link() -> None:
    document = case()
    document["faults"] = [{"type": "fabric_link_down", "link": "leaf-0a~spine-x", "at_s": 1}]
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.link: unknown fabric link"):
        build_cluster(None, scenario_from(document))


def test_checkpoint_pauses_every_rank_and_heartbeats_continue() -> None:
    document = case(checkpoints=[{"job": "job-2", "at_s": 10, "pause_s": 4}])
    _, messages = run(document)
    job = collectives(messages, "job-2")
    enters = sorted({e for m in job for e in m.ops.enter_ns})
    gaps = [b - a for a, b in zip(enters, enters[1:], strict=False)]
    assert max(gaps) > 4 * S
    at = enters[gaps.index(max(gaps))]
    assert T0 + 10 * S <= at + 1 * S
    quiet = [m for m in job if at + S < m.ts_ns < at + 4 * S]
    assert {m.global_rank for m in quiet} == set(range(16))  # alive, silent
    assert all(len(m.ops) == 0 for m in quiet)
