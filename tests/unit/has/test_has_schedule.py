"""schedule(): FIFO, backfill, starvation reservation, invariants, determinism, liveness."""

from __future__ import annotations

import dataclasses
import random

from unit.has.has_builders import A100, H100, L4, GiB, cluster, free_node, job, node, plan

from has import (
    ClusterView,
    GpuSlot,
    NodeView,
    Placement,
    PlanOption,
    QueuedJob,
    QueuePolicy,
    ScheduleResult,
    WaitKind,
    drain_target,
    place_job,
    schedule,
)


def placed_ids(res: ScheduleResult) -> list[str]:
    return [p.job_id for p in res.placements]


# ----- FIFO and backfill ------------------------------------------------------------


def test_fifo_order_when_everything_fits() -> None:
    c = cluster(free_node("a", 8), free_node("b", 8))
    q = [
        job("j3", 3, plan(dp=2)),
        job("j1", 1, plan(dp=4)),
        job("j4", 4, plan(dp=4)),
        job("j2", 2, plan(dp=2)),
    ]
    res = schedule(c, q, now=0.0)
    assert placed_ids(res) == ["j1", "j2", "j3", "j4"]
    assert res.pending == {} and res.blocked_by is None


def test_fifo_earlier_job_wins_contended_gpus() -> None:
    c = cluster(free_node("a", 8))
    q = [job("late", 2, plan(dp=8)), job("early", 1, plan(dp=8))]
    res = schedule(c, q, now=0.0)
    assert placed_ids(res) == ["early"]
    assert res.pending["late"].kind is WaitKind.NO_FIT


def test_backfill_lets_small_job_pass_blocked_head() -> None:
    c = cluster(free_node("a", 8), free_node("b", 0))
    q = [job("big", 1, plan(dp=16)), job("small", 2, plan(dp=2))]
    res = schedule(c, q, now=10.0)
    assert placed_ids(res) == ["small"]
    assert "largest free: 8 × A100-80GB on a" in res.pending["big"].summary
    assert res.blocked_by is None


def test_strict_fifo_when_backfill_off() -> None:
    c = cluster(free_node("a", 8), free_node("b", 0))
    q = [job("big", 1, plan(dp=16)), job("small", 2, plan(dp=2))]
    res = schedule(c, q, now=10.0, policy=QueuePolicy(backfill=False))
    assert placed_ids(res) == []
    assert res.blocked_by == "big"
    assert res.pending["small"].kind is WaitKind.BEHIND_HEAD


def test_job_that_can_never_fit_does_not_block() -> None:
    # 16 A100 requested, 8 exist: no amount of waiting helps, so no reservation either.
    c = cluster(free_node("a", 6))
    q = [job("huge", 1, plan(dp=16), at=0.0), job("small", 2, plan(dp=2), at=0.0)]
    for policy in (QueuePolicy(starvation_s=0.0), QueuePolicy(backfill=False)):
        res = schedule(c, q, now=10_000.0, policy=policy)
        assert placed_ids(res) == ["small"]
        assert res.pending["huge"].kind is WaitKind.NEVER_FITS
        assert "even with every job ended" in res.pending["huge"].summary
        assert res.blocked_by is None


# ----- starvation ------------------------------------------------------------------------


def test_starving_head_blocks_backfill_then_gets_its_gpus() -> None:
    def world(old_running: bool) -> ClusterView:
        a = node("a", busy=range(4) if old_running else (), owner="old")
        return cluster(a, free_node("l4", 4, n=4, gpu_type=L4))

    q = [
        job("head", 1, plan(dp=8), at=0.0),
        job("small", 2, plan(dp=2), at=10.0),
        job("l4-job", 3, plan(L4, dp=2, gib=8), at=10.0),
    ]
    policy = QueuePolicy(starvation_s=300.0)

    # Before the deadline the head is simply skipped and "small" backfills.
    early = schedule(world(True), q, now=100.0, policy=policy)
    assert placed_ids(early) == ["small", "l4-job"]
    assert early.blocked_by is None and early.reservation is None

    # After it, the head holds A100s on node a; "small" must wait, the L4 job still runs.
    late = schedule(world(True), q, now=400.0, policy=policy)
    assert placed_ids(late) == ["l4-job"]
    assert late.blocked_by == "head"
    assert late.pending["head"].kind is WaitKind.RESERVING
    assert "holding 4 free A100-80GB" in late.pending["head"].summary
    assert late.pending["small"].kind is WaitKind.HELD_FOR_STARVING
    assert "held for starving job head" in late.pending["small"].summary
    assert late.reservation is not None
    assert late.reservation.target == (("a", 8),)
    assert late.reservation.held == (("a", (4, 5, 6, 7)),)
    assert late.reservation.missing == 4

    # "old" ends: the head is placed first, before the job that was backfilling.
    freed = schedule(world(False), q, now=500.0, policy=policy)
    assert placed_ids(freed)[0] == "head"
    assert freed.placements[0].nodes == (("a", tuple(range(8))),)
    # "small" has now waited 490 s itself, so it is the next holder.
    assert freed.blocked_by == "small" and freed.pending["small"].kind is WaitKind.RESERVING


def test_starving_head_leaves_other_nodes_to_backfill() -> None:
    # Head needs one whole 8-GPU node. Node b has the most free GPUs, so it is held;
    # node a's free GPUs stay available to smaller jobs.
    c = cluster(free_node("a", 2), free_node("b", 6))
    q = [
        job("head", 1, plan(tp=8), at=0.0),
        job("s1", 2, plan(dp=2), at=1.0),
        job("s2", 3, plan(dp=1), at=1.0),
    ]
    res = schedule(c, q, now=1_000.0)
    assert res.reservation is not None and res.reservation.target == (("b", 8),)
    assert placed_ids(res) == ["s1"]
    assert res.placements[0].nodes[0][0] == "a"
    assert res.pending["s2"].kind is WaitKind.HELD_FOR_STARVING


def test_held_reason_only_when_the_hold_is_what_blocks() -> None:
    # Node b's free GPUs (held for the head) have only 30 GiB free; the 40 GiB jobs fit only on a.
    b = node("b", busy=(6, 7), mem_free={i: 30 * GiB for i in range(6)})
    c = cluster(free_node("a", 2), b)
    q = [
        job("head", 1, plan(tp=8, gib=20), at=0.0),
        job("s1", 2, plan(dp=2, gib=40), at=1.0),
        job("s2", 3, plan(dp=2, gib=40), at=1.0),
        job("s3", 4, plan(dp=2, gib=20), at=1.0),
    ]
    res = schedule(c, q, now=1_000.0)
    assert res.reservation is not None and res.reservation.target == (("b", 8),)
    assert placed_ids(res) == ["s1"]
    # s2 lost to s1, not to the hold; s3 could use b's GPUs if they were not held.
    assert res.pending["s2"].kind is WaitKind.NO_FIT
    assert res.pending["s3"].kind is WaitKind.HELD_FOR_STARVING


def test_a_job_that_chose_to_wait_is_not_labelled_held() -> None:
    # The starving head holds node a's 4 free A100s. "waiter" could start now on the free L4s
    # (slow) but waits 10 s for the H100s (fast): its reason is that choice, not the hold,
    # although one of its plans would also fit the GPUs without the hold.
    now = 1_000_000.0
    h100 = node("h", H100, n=4, busy=range(4), owner="h-run")
    h100 = NodeView("h", tuple(dataclasses.replace(g, free_at=now + 10.0) for g in h100.gpus))
    c = cluster(node("a", busy=range(4, 8), owner="old"), h100, free_node("l4", 4, n=4, gpu_type=L4))
    timed = [PlanOption(H100, 1, 1, 4, 10 * GiB, runtime_s=100.0), PlanOption(L4, 1, 1, 2, 10 * GiB, runtime_s=1_000.0)]
    q = [job("head", 1, plan(dp=8), at=0.0), job("waiter", 2, *timed, at=now - 1.0)]
    res = schedule(c, q, now=now, policy=QueuePolicy.frenzy(starvation_s=3_600.0))
    assert res.blocked_by == "head" and res.reservation is not None and res.reservation.held_count == 4
    assert placed_ids(res) == []
    assert res.pending["waiter"].kind is WaitKind.NO_FIT
    assert "held for starving" not in res.pending["waiter"].summary


def test_holder_prefers_plan_missing_fewest_gpus() -> None:
    # Plan 0 (A100) would still miss 6 GPUs; plan 1 (H100) misses only 1.
    c = cluster(free_node("a", 2), free_node("h", 3, n=4, gpu_type=H100))
    q = [job("head", 1, plan(tp=8), plan(H100, tp=4), at=0.0)]
    res = schedule(c, q, now=1_000.0, policy=QueuePolicy(starvation_s=0.0))
    assert res.reservation is not None
    assert res.reservation.plan_index == 1 and res.reservation.missing == 1


# ----- invariants over random inputs --------------------------------------------------------

TYPES = (A100, H100, L4)


def random_cluster(rng: random.Random) -> ClusterView:
    nodes = []
    for i in range(rng.randint(1, 12)):
        gpu_type = rng.choice(TYPES)
        n = rng.choice((2, 4, 8))
        busy = [k for k in range(n) if rng.random() < 0.4]
        sick = [k for k in range(n) if rng.random() < 0.05]
        low = {k: rng.randint(1, 30) * GiB for k in range(n) if rng.random() < 0.1}
        nodes.append(
            node(
                f"n{i:02d}",
                gpu_type,
                n,
                busy=busy,
                owner=f"run{i}",
                mem_free=low,
                unhealthy=sick,
                alive=rng.random() > 0.05,
                draining=rng.random() < 0.05,
            )
        )
    return ClusterView(nodes)


def random_queue(rng: random.Random) -> list[QueuedJob]:
    jobs = []
    for k in range(rng.randint(0, 25)):
        plans = [
            plan(
                rng.choice(TYPES),
                rng.choice((1, 2, 4, 8)),
                rng.choice((1, 2)),
                rng.randint(1, 4),
                rng.uniform(1, 60),
            )
            for _ in range(rng.randint(0 if k == 0 else 1, 3))
        ]
        jobs.append(job(f"j{k}", k, *plans, at=rng.uniform(0, 1000)))
    rng.shuffle(jobs)
    return jobs


def check_invariants(
    c: ClusterView, queue: list[QueuedJob], res: ScheduleResult, policy: QueuePolicy
) -> None:
    by_id = {j.job_id: j for j in queue}
    ids = placed_ids(res)
    assert len(ids) == len(set(ids))
    assert set(ids).isdisjoint(res.pending) and set(ids) | set(res.pending) == set(by_id)
    used: set[tuple[str, int]] = set()
    for p in res.placements:
        assert by_id[p.job_id].plans[p.plan_index] == p.plan
        assert p.gpu_count == p.plan.num_gpus
        assert len({n for n, _ in p.nodes}) == len(p.nodes)
        for name, indices in p.nodes:
            assert indices and len(indices) % p.plan.tp == 0
            nv = c.node(name)
            assert nv.schedulable
            slots = {g.index: g for g in nv.gpus}
            for i in indices:
                g = slots[i]
                assert g.owner is None and g.healthy
                assert g.gpu_type == p.plan.gpu_type and g.memory_free >= p.plan.bytes_per_gpu
                assert (name, i) not in used, f"GPU {name}:{i} assigned twice"
                used.add((name, i))
    # The whole pass must be reservable in one go (with_reserved refuses double booking).
    view = c
    for p in res.placements:
        view = view.with_reserved(p)
    if res.reservation is not None:
        assert res.blocked_by == res.reservation.job_id
        assert res.pending[res.reservation.job_id].kind is WaitKind.RESERVING
        assert used.isdisjoint(res.reservation.gpus())
        view.with_owned(res.reservation.gpus(), "hold")  # held GPUs are free and not placed
        assert sum(n for _, n in res.reservation.target) == res.reservation.plan.num_gpus
    if not policy.backfill:
        order = sorted(queue, key=lambda j: j.seq)
        blocked = [
            j.seq
            for j in order
            if res.pending.get(j.job_id, None) is not None and res.pending[j.job_id].kind is WaitKind.NO_FIT
        ]
        if blocked:
            assert all(by_id[i].seq < blocked[0] for i in ids)


def test_random_passes_keep_invariants_and_are_deterministic() -> None:
    rng = random.Random(20241219)
    for _ in range(300):
        c = random_cluster(rng)
        q = random_queue(rng)
        policy = QueuePolicy(backfill=rng.random() < 0.8, starvation_s=rng.choice((0.0, 300.0, 1e9)))
        res = schedule(c, q, now=1000.0, policy=policy)
        check_invariants(c, q, res, policy)
        # Same input, and the same queue in another order: the same decisions.
        shuffled = list(q)
        rng.shuffle(shuffled)
        for again in (
            schedule(c, q, now=1000.0, policy=policy),
            schedule(c, shuffled, now=1000.0, policy=policy),
        ):
            assert again == res


def test_determinism_on_a_fixed_case() -> None:
    c = cluster(free_node("a", 3), free_node("b", 5), free_node("c", 8, gpu_type=H100))
    q = [job(f"j{i}", i, plan(dp=1 + i % 3), plan(H100, tp=2), at=float(i)) for i in range(8)]
    results = {repr(schedule(c, q, now=50.0, policy=QueuePolicy(starvation_s=45.0))) for _ in range(5)}
    assert len(results) == 1


# ----- liveness in a small time-stepped simulation -------------------------------------------------


def simulate(
    nodes: list[tuple[str, str, int]],
    arrivals: list[tuple[float, str, tuple[PlanOption, ...], float]],
    policy: QueuePolicy,
    horizon: float,
    step: float = 10.0,
    passes: list[ScheduleResult] | None = None,
) -> dict[str, float]:
    """Run schedule() every ``step`` seconds; return job id → start time.

    nodes: (name, gpu type, count); arrivals: (time, job id, plans, duration);
    every pass's result is appended to ``passes`` when given.
    """
    start: dict[str, float] = {}
    running: dict[str, tuple[float, Placement]] = {}
    queue: list[QueuedJob] = []
    durations = {jid: dur for _, jid, _, dur in arrivals}
    pending_arrivals = sorted(arrivals, key=lambda a: a[0])
    seq = 0
    t = 0.0
    while t <= horizon:
        running = {jid: v for jid, v in running.items() if v[0] > t}
        while pending_arrivals and pending_arrivals[0][0] <= t:
            at, jid, plans, _ = pending_arrivals.pop(0)
            queue.append(QueuedJob(jid, seq, at, plans))
            seq += 1
        owners = {(n, i): jid for jid, (_, p) in running.items() for n, i in p.gpus()}
        view = ClusterView(
            [
                NodeView(
                    name,
                    tuple(
                        GpuSlot(name, i, gt, 80 * GiB, 80 * GiB, owners.get((name, i))) for i in range(count)
                    ),
                )
                for name, gt, count in nodes
            ]
        )
        res = schedule(view, queue, t, policy)
        if passes is not None:
            passes.append(res)
        for p in res.placements:
            start[p.job_id] = t
            running[p.job_id] = (t + durations[p.job_id], p)
        queue = [j for j in queue if j.job_id not in start]
        if not pending_arrivals and not running:
            break  # nothing left can change: what still waits never fits
        t += step
    return start


def test_big_job_starves_without_reservation_and_runs_with_it() -> None:
    # Two 8-GPU nodes; a 16-GPU job at t=0 behind a steady stream of 1-GPU jobs.
    nodes = [("a", A100, 8), ("b", A100, 8)]
    arrivals = [(0.0, "small-pre", (plan(dp=1),), 30.0), (0.0, "big", (plan(tp=8, dp=2),), 50.0)]
    arrivals += [(float(t), f"s{t}-{k}", (plan(dp=1),), 40.0) for t in range(0, 2000, 10) for k in range(2)]
    arrivals.sort(key=lambda a: a[0])

    no_guard = simulate(nodes, arrivals, QueuePolicy(starvation_s=1e9), horizon=1500.0)
    assert "big" not in no_guard  # the stream of small jobs never leaves both nodes empty

    guarded = simulate(nodes, arrivals, QueuePolicy(starvation_s=100.0), horizon=1500.0)
    assert "big" in guarded and guarded["big"] <= 100.0 + 40.0 + 20.0
    # Small jobs keep running after the big one: it was a pause, not a shutdown.
    assert any(t > guarded["big"] + 50.0 for jid, t in guarded.items() if jid.startswith("s"))


def test_random_workloads_every_job_that_can_fit_eventually_runs() -> None:
    rng = random.Random(7)
    holds = 0
    for _ in range(12):
        nodes = [(f"n{i}", rng.choice((A100, H100)), rng.choice((4, 8))) for i in range(rng.randint(2, 5))]
        arrivals = []
        for k in range(40):
            plans = tuple(
                plan(rng.choice((A100, H100)), rng.choice((1, 2, 4)), 1, rng.choice((1, 1, 2, 4)))
                for _ in range(rng.randint(1, 2))
            )
            arrivals.append((float(rng.randint(0, 400)), f"j{k}", plans, float(rng.randint(10, 120))))
        passes: list[ScheduleResult] = []
        start = simulate(nodes, arrivals, QueuePolicy(starvation_s=60.0), horizon=50_000.0, passes=passes)
        # The liveness argument: while one job holds, its missing count never grows.
        for prev, cur in zip(passes, passes[1:], strict=False):
            if prev.reservation and cur.reservation and prev.reservation.job_id == cur.reservation.job_id:
                assert cur.reservation.missing <= prev.reservation.missing
        holds += sum(1 for r in passes if r.reservation)
        fits = ClusterView(
            [
                NodeView(n, tuple(GpuSlot(n, i, gt, 80 * GiB, 80 * GiB, None) for i in range(c)))
                for n, gt, c in nodes
            ]
        )
        for _, jid, plans, _ in arrivals:
            if isinstance(place_job(fits, jid, plans), Placement):
                assert jid in start, f"{jid} fits an empty cluster but never started"
    assert holds > 0  # the workloads did exercise the starvation reservation


def test_drain_target_holds_the_most_free_gpus_possible() -> None:
    """Brute force over every way to spread the plan's TP groups: the greedy is exact."""
    import itertools

    rng = random.Random(3)
    for _ in range(300):
        c = random_cluster(rng)
        p = plan(rng.choice(TYPES), rng.choice((1, 2, 4)), 1, rng.randint(1, 6), rng.uniform(1, 40))
        caps, frees = [], []
        for name in c.healthy_by_node(p.gpu_type):
            gs = [g for g in c.node(name).gpus if g.gpu_type == p.gpu_type and g.healthy]
            f = sum(1 for g in gs if g.owner is None and g.memory_free >= p.bytes_per_gpu)
            b = sum(1 for g in gs if g.owner is not None and g.memory_total >= p.bytes_per_gpu)
            caps.append((f + b) // p.tp)
            frees.append(f)
        need = p.num_gpus // p.tp
        best = -1
        for xs in itertools.product(*(range(cap + 1) for cap in caps)):
            if sum(xs) == need:
                best = max(best, sum(min(x * p.tp, f) for x, f in zip(xs, frees, strict=True)))
        res = drain_target(c, "j", [p])
        if best < 0:
            assert res is None
        else:
            assert res is not None and res.held_count == best
            assert sum(n for _, n in res.target) == p.num_gpus
