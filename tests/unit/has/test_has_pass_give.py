"""``PassFree.give`` (preemption's what-if: a running job's GPUs freed) answers exactly as a
``PassFree`` built from a view in which those GPUs were free, with the same takes replayed —
the way preemption used to build it, at the cost of copying every node of the type."""

from __future__ import annotations

import dataclasses
import random

import pytest
from unit.has.has_builders import A100, L4, MEM, cluster, node, plan

from has import ClusterView, NodeView
from has.pass_state import PassFree

GiB = 1024**3


def _random_cluster(rng: random.Random) -> ClusterView:
    nodes: list[NodeView] = []
    for k in range(rng.randint(1, 7)):
        t = rng.choice([A100, L4])
        n = rng.choice([4, 8])
        owners = {i: rng.choice(["victim", "other", None, None]) for i in range(n)}
        busy = [i for i, o in owners.items() if o]
        v = node(f"n{k}", t, n, busy=busy, mem_free={i: rng.choice([MEM[t], MEM[t] - 5 * GiB]) for i in range(n)})
        gpus = tuple(dataclasses.replace(g, owner=owners[g.index]) if g.owner else g for g in v.gpus)
        nodes.append(dataclasses.replace(v, gpus=gpus))
    return cluster(*nodes)


def _freed(view: ClusterView, slots: list) -> ClusterView:
    gone = {(g.node, g.index) for g in slots}
    return ClusterView([dataclasses.replace(n, gpus=tuple(
        dataclasses.replace(g, owner=None, memory_free=g.memory_total, free_at=None) if (n.name, g.index) in gone
        else g for g in n.gpus)) for n in view.nodes])  # fmt: skip


@pytest.mark.parametrize("seed", range(60))
def test_give_equals_a_rebuilt_index(seed: int) -> None:
    rng = random.Random(seed)
    view = _random_cluster(rng)
    victim = view.gpus_by_owner().get("victim", [])
    slots = [g for g in victim if g.gpu_type == victim[0].gpu_type] if victim else []
    if not slots:
        return
    gpu_type = slots[0].gpu_type
    shapes = [plan(gpu_type, tp=tp, dp=dp, gib=gib) for tp in (1, 2, 4) for dp in (1, 2, 3, 4) for gib in (10, 76)]
    # the pass took some placements first
    free = PassFree(view)
    takes = []
    for p in rng.sample(shapes, 4):
        nodes = free.choose(p)
        if nodes is not None:
            free.take(p.gpu_type, nodes, True)
            takes.append((p.gpu_type, nodes))
    given = free.copy()
    given.give(gpu_type, [dataclasses.replace(g, owner=None, memory_free=g.memory_total, free_at=None) for g in slots])
    rebuilt = PassFree(_freed(view, slots))
    for t, nodes in takes:
        rebuilt.take(t, nodes, True)
    assert given.total == {t: c for t, c in rebuilt.total.items()}
    for p in shapes:
        assert given.fits(p.gpu_type, p.tp, p.num_gpus, p.bytes_per_gpu) == rebuilt.fits(
            p.gpu_type, p.tp, p.num_gpus, p.bytes_per_gpu), p
        assert given.choose(p) == rebuilt.choose(p), p
    # the original index is untouched (give works on a copy)
    assert free.total.get(gpu_type, 0) + len(slots) == given.total[gpu_type]


def test_give_refuses_a_gpu_that_is_free_already() -> None:
    view = cluster(node("a", A100, 4, busy=[2, 3], owner="victim"))
    free = PassFree(view)
    free_gpu = next(g for g in view.nodes[0].gpus if g.owner is None)
    with pytest.raises(ValueError, match="free already"):
        free.give(A100, [free_gpu])
