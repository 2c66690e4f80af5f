"""``frenzy-blind`` (issue 32): frenzy with no knowledge of a job's length, beside the size-aware
default. Held to it by behaviour: on random states, scrambling every plan's ``runtime_s`` and
every busy GPU's ``free_at`` (what the length feeds) never changes one decision of the pass,
running jobs (which the long-job stop would weigh) included; and the same scrambling does change
``frenzy``'s decisions, so the check has teeth."""

from __future__ import annotations

import dataclasses
import random

from unit.has.test_has_equivalence import plain as _plain
from unit.has.test_has_equivalence import random_cluster, random_queue

from has import POLICY_NAMES, ClusterView, NodeView, QueuedJob, QueuePolicy, RunningJob, schedule
from has.policy import PlanChoice, QueueOrder


def _scramble(rng: random.Random, cluster: ClusterView, queue: list[QueuedJob]) -> tuple[ClusterView, list[QueuedJob]]:
    """The same state with every runtime and every estimated release redrawn (or dropped)."""

    def runtime() -> float | None:
        return None if rng.random() < 0.1 else rng.uniform(1.0, 1e6)

    memo: dict[int, tuple] = {}
    jobs = []
    for j in queue:
        plans = memo.setdefault(id(j.plans), tuple(dataclasses.replace(p, runtime_s=runtime()) for p in j.plans))
        jobs.append(QueuedJob(j.job_id, j.seq, j.submitted_at, plans, j.priority))
    nodes = []
    for n in cluster.nodes:
        gpus = tuple(dataclasses.replace(g, free_at=None if g.owner is None else rng.choice([None, rng.uniform(0, 1e6)]))
                     for g in n.gpus)  # fmt: skip
        nodes.append(NodeView(n.name, gpus, n.alive, n.draining))
    return ClusterView(nodes), jobs


def plain(res: object) -> tuple:
    """The decisions of a pass (placements, pending reasons, holder, reservation, preemptions),
    each plan without its runtime (the scrambled field itself)."""
    placements, pending, blocked_by, reservation = _plain(res)  # type: ignore[arg-type]
    placements = [(j, i, plan[:-1], nodes) for j, i, plan, nodes in placements]
    if reservation is not None:
        reservation = (reservation[0], reservation[1], reservation[2][:-1], *reservation[3:])
    stops = [p.job_id for p in res.preemptions]  # type: ignore[attr-defined]
    return placements, pending, blocked_by, reservation, stops


def _running(rng: random.Random, cluster: ClusterView, now: float) -> list[RunningJob]:
    owners = sorted({g.owner for n in cluster.nodes for g in n.gpus if g.owner is not None})
    return [RunningJob(o, now - rng.uniform(0, 5e4), now - rng.uniform(5e4, 1e5), True) for o in owners]


def test_frenzy_blind_is_registered_beside_the_default() -> None:
    assert "frenzy-blind" in POLICY_NAMES
    blind = QueuePolicy.named("frenzy-blind")
    assert blind.order is QueueOrder.FIFO and blind.plan_choice is PlanChoice.RANKED
    assert blind.preempt_long_gain == 0.0 and blind.starvation_stretch == 0.0
    # the live scheduler's default is still the size-aware frenzy
    assert QueuePolicy.named("frenzy") == QueuePolicy.frenzy() != blind


def test_frenzy_blind_never_reads_a_runtime_or_a_release_estimate() -> None:
    blind = QueuePolicy.named("frenzy-blind", explain=False)
    aware = QueuePolicy.named("frenzy", explain=False)
    aware_moved = 0
    for case in range(300):
        rng = random.Random(case)
        now = 1e5
        cluster, queue = random_cluster(rng, now), random_queue(rng, now)
        running = _running(rng, cluster, now)
        other_cluster, other_queue = _scramble(rng, cluster, queue)
        try:
            first = plain(schedule(cluster, queue, now, blind, running))
        except ValueError as exc:  # a malformed random state: the same error either way
            first = ("error", str(exc))
        try:
            second = plain(schedule(other_cluster, other_queue, now, blind, running))
        except ValueError as exc:
            second = ("error", str(exc))
        assert first == second, f"case {case}: frenzy-blind's decisions moved with the runtimes"
        try:
            if plain(schedule(cluster, queue, now, aware, running)) != plain(
                schedule(other_cluster, other_queue, now, aware, running)
            ):
                aware_moved += 1
        except ValueError:
            pass
    assert aware_moved > 30  # the size-aware frenzy does read them: the scrambling matters
