"""``ClusterView.updated``: a view built from the previous one answers exactly as a fresh one.

The scheduler service keeps its view across ticks and rebuilds only the nodes that changed.
Every random change here — GPUs taken and released, release estimates (unknown, NaN, past),
health, free memory, dead / draining / revived nodes, nodes added between others and
removed, a GPU type appearing or vanishing, memory sizes changing — goes through both
``previous.updated(nodes)`` and ``ClusterView(nodes)``; every query and whole scheduling
passes under several policies must agree, over chains of updates, with the previous view's
derived indexes warmed or not. The previous view must not change.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from unit.has.test_has_equivalence import POLICIES, TYPES, random_cluster, random_queue

from has import ClusterView, GpuSlot, NodeView, schedule

GiB = 1 << 30
NOW = 10_000.0


def describe(view: ClusterView, now: float = NOW) -> dict:
    """Every answer a view gives, as plain data (free_at NaN compared by identity via repr)."""
    types = sorted(set(TYPES) | {t for n in view.nodes for g in n.gpus for t in [g.gpu_type]} | {"B200"})
    out: dict = {
        "nodes": [(n.name, n.alive, n.draining, repr(n.gpus)) for n in view.nodes],
        "types": sorted(view.gpu_types()),
        "summary": view.free_summary(),
        "free": view.free_count(),
        "owners": {o: [(g.node, g.index) for g in slots] for o, slots in view.gpus_by_owner().items()},
    }
    for t in types:
        levels = sorted({g.memory_total for n in view.nodes for g in n.gpus if g.gpu_type == t} | {1, 200 * GiB})
        out[t] = {
            "free_by_node": [(k, v.slots, v.mem_sorted, v.indices) for k, v in view.free_by_node(t).items()],
            "healthy": list(view.healthy_by_node(t).items()),
            "count": view.free_count(t),
            "buckets": view.free_buckets(t),
            "drain": view.drain_inventory(t),
            "levels": [(b, view.memory_level(t, b), list(view.capacity_by_node(t, b).items()),
                        [view.capacity_groups(t, b, tp) for tp in (1, 2, 4, 8)]) for b in levels],
            "releases": [repr(view.release_times(t, b, at)) for b in levels for at in (now, now + 150.0)],
            "runs": [repr(view.release_runs(t, b, at)) for b in levels for at in (now, now + 150.0)],
        }
    return out


def warm(view: ClusterView, rng: random.Random) -> None:
    """Fill some of the view's derived caches, so the update must decide which still hold."""
    if rng.random() < 0.6:
        view.gpus_by_owner()
    for t in view.gpu_types():
        if rng.random() < 0.6:
            view.free_buckets(t)
        if rng.random() < 0.5:
            view.drain_inventory(t)
        if rng.random() < 0.6:
            level = view.memory_level(t, 1)
            if level is not None:
                view.release_times(t, level, NOW)
                if rng.random() < 0.5:
                    view.release_runs(t, level, NOW)


def mutate(rng: random.Random, view: ClusterView) -> list[NodeView]:
    nodes = list(view.nodes)
    out = []
    for node in nodes:
        r = rng.random()
        if r < 0.55:
            out.append(node)  # unchanged: the same object
            continue
        if r < 0.62:
            continue  # removed
        if r < 0.7:
            out.append(dataclasses.replace(node))  # equal, but a new object: indexed anew
            continue
        gpus = []
        for g in node.gpus:
            if rng.random() < 0.4:
                change = rng.choice(["take", "release", "estimate", "health", "memory", "size"])
                if change == "take" and g.owner is None:
                    g = dataclasses.replace(g, owner=f"new{rng.randint(0, 3)}",
                                            free_at=rng.choice([None, math.nan, NOW - 5.0, NOW + 100.0]))
                elif change == "release":
                    g = dataclasses.replace(g, owner=None, free_at=None)
                elif change == "estimate" and g.owner is not None:
                    g = dataclasses.replace(g, free_at=rng.choice([None, math.nan, NOW + rng.uniform(-50, 900)]))
                elif change == "health":
                    g = dataclasses.replace(g, healthy=not g.healthy)
                elif change == "memory":
                    g = dataclasses.replace(g, memory_free=rng.randint(0, g.memory_total))
                elif change == "size":
                    g = dataclasses.replace(g, memory_total=g.memory_total // 2, memory_free=g.memory_total // 2)
            gpus.append(g)
        state = rng.random()
        alive, draining = (node.alive, node.draining) if state < 0.7 else (state > 0.8, 0.75 < state < 0.85)
        out.append(NodeView(node.name, tuple(gpus), alive, draining))
    for k in range(rng.choice([0, 0, 1, 3])):  # new nodes, some sorting between the old ones
        gpu_type = rng.choice(sorted(TYPES) + ["H200-141GB"])
        total = TYPES.get(gpu_type, (141 * GiB, 8))[0]
        name = rng.choice([f"n{rng.randint(0, 30):02d}b{k}", f"a-new{k}", f"z-new{k}"])
        if any(n.name == name for n in out):
            continue
        gpus = tuple(GpuSlot(name, i, gpu_type, total, total, None if rng.random() < 0.7 else "x",
                             free_at=rng.choice([None, NOW + 50.0])) for i in range(rng.choice([1, 4, 8])))
        out.append(NodeView(name, gpus))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_an_updated_view_answers_as_a_fresh_one_over_chains_of_changes(seed: int) -> None:
    rng = random.Random(seed)
    view = random_cluster(rng, NOW)
    for _ in range(4):
        if rng.random() < 0.7:
            warm(view, rng)
        before = describe(view)
        nodes = mutate(rng, view)
        updated = view.updated(nodes)
        fresh = ClusterView(nodes)
        assert describe(updated) == describe(fresh)
        assert describe(view) == before, "the previous view changed"
        queue = random_queue(rng, NOW)
        for policy in rng.sample(POLICIES, 3):
            assert schedule(updated, queue, NOW, policy) == schedule(fresh, queue, NOW, policy), policy
        view = updated


def test_nothing_changed_gives_the_same_view_and_one_change_rebuilds_only_its_type() -> None:
    view = random_cluster(random.Random(7), NOW)
    assert view.updated(view.nodes) is view
    assert view.updated(list(reversed(view.nodes))) is view
    types = sorted(view.gpu_types())
    for t in types:
        view.free_buckets(t)
    target = next(n for n in view.nodes if n.schedulable and any(g.healthy for g in n.gpus))
    t = next(g.gpu_type for g in target.gpus if g.healthy)
    changed = NodeView(target.name, tuple(dataclasses.replace(g, owner="x") if g.gpu_type == t else g
                                          for g in target.gpus))
    updated = view.updated([changed if n is target else n for n in view.nodes])
    for other in types:  # untouched types keep the very same derived index object (the buckets;
        # a compiled build hands out a new (buckets, least) pair around it on every call)
        assert (updated.free_buckets(other)[0] is view.free_buckets(other)[0]) == (other != t)
    assert updated.free_by_node(t).get(target.name) is None
    assert describe(updated) == describe(ClusterView(updated.nodes))


def test_bad_nodes_are_rejected_as_by_the_constructor() -> None:
    view = random_cluster(random.Random(3), NOW)
    nodes = list(view.nodes)
    with pytest.raises(ValueError, match="duplicate node name"):
        view.updated(nodes + [nodes[0]])
    g = GpuSlot("elsewhere", 0, "L4", 24 * GiB, 24 * GiB, None)
    with pytest.raises(ValueError, match="listed under node 'zz'"):
        view.updated(nodes + [NodeView("zz", (g,))])
    g0 = GpuSlot("zz", 0, "L4", 24 * GiB, 24 * GiB, None)
    with pytest.raises(ValueError, match="duplicate GPU index 0"):
        view.updated(nodes + [NodeView("zz", (g0, g0))])
    assert describe(view) == describe(ClusterView(nodes))
