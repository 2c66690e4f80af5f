"""The pools a submission plans for and the predictor answers kept for it, without Redis:
``frenzy.scheduler.submit_pools``: ``pools_of`` (a view -> one GpuPool per type), ``ClusterPools`` (which view, how old) and
``Predictions`` (the LRU by model, recipe, limits and pools)."""

from __future__ import annotations

import pytest

from frenzy.scheduler.submit_pools import ClusterPools, Predictions, pools_of
from frenzy.state.cluster_read import ClusterSnapshot
from frenzy.v1 import predictor_pb2, types_pb2
from has import ClusterView, GpuSlot, NodeView

GiB = 1024**3


def _node(name: str, gpu_type: str, count: int, alive: bool = True, draining: bool = False,
          unhealthy: int = 0) -> NodeView:
    return NodeView(name, tuple(GpuSlot(name, i, gpu_type, 80 * GiB, 80 * GiB, None, healthy=i >= unhealthy)
                                for i in range(count)), alive=alive, draining=draining)


def _pools(pools: list[types_pb2.GpuPool]) -> dict[str, tuple[int, int]]:
    return {p.gpu_type: (p.total_gpus, p.gpus_per_node) for p in pools}


def test_pools_count_live_schedulable_nodes_only() -> None:
    view = ClusterView([
        _node("a", "A100-80GB", 8), _node("b", "A100-80GB", 4, unhealthy=2),  # unhealthy GPUs still count
        _node("dead", "A100-80GB", 16, alive=False), _node("drain", "H100-80GB", 8, draining=True),
        _node("l", "L4", 2), _node("untyped", "", 4),
    ])
    pools = pools_of(view)
    assert [p.gpu_type for p in pools] == ["A100-80GB", "L4"]
    assert _pools(pools) == {"A100-80GB": (12, 8), "L4": (2, 2)}
    assert pools_of(ClusterView([])) == []


class Reads:
    """A store whose cluster read hands out the views given, counting the reads."""

    def __init__(self, *views: ClusterView) -> None:
        self.views = list(views)
        self.reads = 0

    def cluster(self) -> ClusterSnapshot:
        self.reads += 1
        return ClusterSnapshot(self.views.pop(0))

    def node_prices(self, nodes: list[str]) -> dict[str, float]:
        return {}  # (no node sets its own price: the catalog's)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_recent_loop_view_is_used_and_an_old_one_read_again() -> None:
    clock = Clock()
    loop_view = ClusterView([_node("a", "A100-80GB", 8)])
    read_view = ClusterView([_node("a", "A100-80GB", 8), _node("l", "L4", 2)])
    seen: list[tuple[float, ClusterView] | None] = [(clock.now, loop_view)]
    store = Reads(read_view, ClusterView([]))
    pools = ClusterPools(store, lambda: seen[0], max_age_s=1.0, clock=clock,  # type: ignore[arg-type]
                         background=lambda work: work())  # the refresh done at once, here
    assert _pools(pools.current()) == {"A100-80GB": (8, 8)} and store.reads == 0
    clock.now += 1.5  # the loop stopped reading (empty queue): one read, then it is used
    assert _pools(pools.current()) == {"A100-80GB": (8, 8), "L4": (2, 2)} and store.reads == 1
    clock.now += 0.5
    assert _pools(pools.current()) == {"A100-80GB": (8, 8), "L4": (2, 2)} and store.reads == 1
    seen[0] = (clock.now, loop_view)  # a newer tick wins over our own read
    assert _pools(pools.current()) == {"A100-80GB": (8, 8)} and store.reads == 1
    assert pools.current(fresh=True) == [] and store.reads == 2
    with pytest.raises(ValueError):
        ClusterPools(store, lambda: None, max_age_s=-1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ClusterPools(store, lambda: None, max_age_s=2.0, max_stale_s=1.0)  # type: ignore[arg-type]


def test_a_stale_view_is_served_while_one_read_refreshes_it_and_a_very_old_one_is_waited_for() -> None:
    # An API process that never ticks: no submission waits for the once-a-second read, except
    # the first one and one after the view grew older than max_stale_s.
    clock = Clock()
    old = ClusterView([_node("a", "A100-80GB", 8)])
    new = ClusterView([_node("a", "A100-80GB", 8), _node("l", "L4", 2)])
    newest = ClusterView([_node("h", "H100-80GB", 4)])
    store = Reads(old, new, newest)
    queued: list = []
    pools = ClusterPools(store, lambda: None, max_age_s=1.0, max_stale_s=5.0, clock=clock,  # type: ignore[arg-type]
                         background=queued.append)
    assert _pools(pools.current()) == {"A100-80GB": (8, 8)} and store.reads == 1  # the first waits
    clock.now += 2.0
    assert _pools(pools.current()) == {"A100-80GB": (8, 8)} and store.reads == 1  # stale, served
    assert _pools(pools.current()) == {"A100-80GB": (8, 8)} and len(queued) == 1  # one refresh at a time
    queued.pop()()  # the background read lands
    assert store.reads == 2 and _pools(pools.current()) == {"A100-80GB": (8, 8), "L4": (2, 2)}
    clock.now += 10.0  # past max_stale_s: this submission waits for a read
    assert _pools(pools.current()) == {"H100-80GB": (4, 4)} and store.reads == 3 and not queued


def _request(model: str, pools: dict[str, int]) -> predictor_pb2.PredictRequest:
    return predictor_pb2.PredictRequest(
        model=types_pb2.ModelSpec(catalog_name=model), recipe=types_pb2.TrainingRecipe(seq_len=128, global_batch=8),
        pools=[types_pb2.GpuPool(gpu_type=t, total_gpus=n, gpus_per_node=n) for t, n in sorted(pools.items())])


def _answer(name: str) -> predictor_pb2.PredictResponse:
    return predictor_pb2.PredictResponse(model_name=name, plans=[types_pb2.Plan(gpu_type="A100-80GB", num_gpus=1)])


def test_answers_are_kept_by_request_bounded_and_copied() -> None:
    kept = Predictions(size=2)
    a, b, c = (_request(m, {"A100-80GB": 8}) for m in ("gpt2-124m", "llama-2-7b", "llama-2-13b"))
    assert kept.get(a) is None
    kept.put(a, _answer("a"))
    got = kept.get(a)
    assert got is not None and got.model_name == "a"
    got.plans[0].num_gpus = 99  # a caller's change stays its own
    assert kept.get(a).plans[0].num_gpus == 1
    kept.put(b, _answer("b"))
    kept.get(a)  # a used last: b is the least recently used
    kept.put(c, _answer("c"))
    assert len(kept) == 2 and kept.get(b) is None and kept.get(a) is not None and kept.get(c) is not None
    assert kept.hits == 5 and kept.misses == 2


def test_answers_hold_while_the_pools_do_and_for_their_lifetime() -> None:
    clock = Clock()
    kept = Predictions(size=8, ttl_s=60.0, clock=clock)
    eight, twelve = _request("gpt2-124m", {"A100-80GB": 8}), _request("gpt2-124m", {"A100-80GB": 12})
    kept.put(eight, _answer("eight"))
    assert kept.get(eight) is not None
    assert kept.get(twelve) is None and len(kept) == 0  # the pools changed: every answer goes
    kept.put(eight, _answer("late"))  # planned on pools other than the latest asked for: not kept
    assert len(kept) == 0 and kept.get(twelve) is None
    kept.put(twelve, _answer("twelve"))
    clock.now += 61.0
    assert kept.get(twelve) is None and len(kept) == 0
    Predictions(size=0).put(eight, _answer("none"))  # size 0 keeps nothing
    with pytest.raises(ValueError):
        Predictions(size=-1)
