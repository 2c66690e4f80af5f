"""What a submission plans for, cheaply (issue 15): the GPU pools of the live cluster from a
recent view, and the predictor's answers kept per (model, recipe, limits, pools).

A submission used to read every node and GPU from Redis (``load_nodes``: ~500 commands on 50
nodes) and ask the predictor each time; now the pools come from a cluster view at most
``DEFAULT_POOLS_MAX_AGE_S`` old and a sweep's repeated requests are answered from ``Predictions``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from frenzy.state.store import StateStore
from frenzy.v1 import predictor_pb2, types_pb2
from has import ClusterView

log = logging.getLogger(__name__)

# How old a cluster view may be for a submission's pools: the loop reads the cluster on every
# tick while jobs wait, so under load the pools cost nothing; a node that dies or drains drops
# out of them within this.
DEFAULT_POOLS_MAX_AGE_S = 1.0
# Up to this old, a view is served while a newer one is read in the background.
DEFAULT_POOLS_MAX_STALE_S = 5.0
# Predictor answers kept: a sweep submits the same few (model, recipe, limits) many times.
DEFAULT_PREDICTIONS_KEPT = 512
# A predictor restarted with a new catalog or model is heard within this, whatever the pools do.
PREDICTION_TTL_S = 300.0
# Nodes' own prices (``frenzy agent --price-per-gpu-hour``) are re-read at most this often: they
# change only when an agent registers again, and one read is a round trip over every node.
DEFAULT_PRICES_MAX_AGE_S = 30.0


def pools_of(view: ClusterView, prices: Mapping[str, float] | None = None) -> list[types_pb2.GpuPool]:
    """One pool per GPU type among live, schedulable nodes: its GPUs in all and the most one node
    has. Every GPU with a type counts, healthy or not (as the predictor has always been told).

    ``prices``: node -> its operator's price per GPU-hour; a pool's price is the highest of its
    nodes' (a budget is a limit: the plan is priced at what it may cost), 0 (the catalog's list
    price) when none of them has one."""
    total: dict[str, int] = {}
    per_node: dict[str, int] = {}
    price: dict[str, float] = {}
    for node in view.nodes:
        if not node.schedulable:
            continue
        counts: dict[str, int] = {}
        for gpu in node.gpus:
            if gpu.gpu_type:
                counts[gpu.gpu_type] = counts.get(gpu.gpu_type, 0) + 1
        own = (prices or {}).get(node.name, 0.0)
        for t, c in counts.items():
            total[t] = total.get(t, 0) + c
            per_node[t] = max(per_node.get(t, 0), c)
            price[t] = max(price.get(t, 0.0), own)
    return [types_pb2.GpuPool(gpu_type=t, total_gpus=total[t], gpus_per_node=per_node[t],
                              price_per_gpu_hour=price[t]) for t in sorted(total)]


class ClusterPools:
    """The GPU pools a submission plans for, from a cluster view at most ``max_age_s`` old.

    ``latest`` gives the loop's last tick view as ``(time.time(), view)`` (or None): recent while
    jobs wait, since every such tick reads the cluster. Otherwise the view comes from an
    incremental ``store.cluster()`` read of our own (two or three round trips: node heads, the
    GPUs of nodes that changed, their owners). A view older than ``max_age_s`` but at most
    ``max_stale_s`` is still served while one read refreshes it in the background: an API
    process that does not lead (``--serve api``) never ticks, and every submission that came
    while its once-a-second read was under way waited for it (issue 15: most of SubmitJob's p99
    under load). Only the first submission, one after a long quiet spell and ``fresh`` wait for
    a read. Pools are built once per view.
    """

    def __init__(self, store: StateStore, latest: Callable[[], tuple[float, ClusterView] | None],
                 max_age_s: float = DEFAULT_POOLS_MAX_AGE_S, clock: Callable[[], float] = time.time,
                 max_stale_s: float = DEFAULT_POOLS_MAX_STALE_S,
                 background: Callable[[Callable[[], None]], None] | None = None) -> None:
        if max_age_s < 0 or max_stale_s < max_age_s:
            raise ValueError(f"pools max age must be >= 0 s and at most their max staleness "
                             f"(got {max_age_s}, {max_stale_s})")
        self.store = store
        self.latest = latest
        self.max_age_s = max_age_s
        self.max_stale_s = max_stale_s
        self.clock = clock
        self.reads = 0  # cluster reads of our own (the loop's views cost nothing)
        self._background = background or _in_a_thread
        self._read_lock = threading.Lock()  # one read at a time: the store's view caches are not shared-safe
        self._state_lock = threading.Lock()
        self._refreshing = False
        self._own: tuple[float, ClusterView] | None = None
        self._built: tuple[ClusterView, list[types_pb2.GpuPool]] | None = None
        self.prices_max_age_s = DEFAULT_PRICES_MAX_AGE_S
        self._prices: tuple[float, dict[str, float]] = (-math.inf, {})  # (when read, node -> price)

    def current(self, fresh: bool = False) -> list[types_pb2.GpuPool]:
        """The pools now; ``fresh``: from a read made after this call began, whatever the age."""
        view = None if fresh else self._newest(self.max_age_s)
        if view is None and not fresh and self._newest(self.max_stale_s) is not None:
            self._refresh_soon()
            view = self._newest(self.max_stale_s)  # (the refreshed one, when it already came)
        if view is None:
            with self._read_lock:
                view = None if fresh else self._newest(self.max_age_s)  # another submission may just have read
                if view is None:
                    view = self._read_locked()
        built = self._built
        read_at, prices = self._prices
        if self.clock() - read_at > self.prices_max_age_s:
            prices = self.store.node_prices([n.name for n in view.nodes])
            self._prices, built = (self.clock(), prices), None
        if built is None or built[0] is not view:
            built = (view, pools_of(view, prices))
            self._built = built
        return list(built[1])

    def _read_locked(self) -> ClusterView:
        at = self.clock()
        view = self.store.cluster().view
        self.reads += 1
        self._own = (at, view)
        return view

    def _refresh_soon(self) -> None:
        """One background read at a time."""
        with self._state_lock:
            if self._refreshing:
                return
            self._refreshing = True

        def refresh() -> None:
            try:
                with self._read_lock:
                    if self._newest(self.max_age_s) is None:
                        self._read_locked()
            except Exception:  # noqa: BLE001 - the next submission reads (or refreshes) again
                log.warning("refreshing the cluster view for submissions failed", exc_info=True)
            finally:
                with self._state_lock:
                    self._refreshing = False

        self._background(refresh)

    def _newest(self, within_s: float) -> ClusterView | None:
        seen = [s for s in (self.latest(), self._own) if s is not None]
        if not seen:
            return None
        at, view = max(seen, key=lambda s: s[0])
        return view if self.clock() - at <= within_s else None


def _in_a_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="pools-refresh", daemon=True).start()


class Predictions:
    """The predictor's answers by request (model, recipe, limits, pools): the last ``size`` used,
    each for at most ``ttl_s``, all dropped when the pools change (an answer holds for the pools
    it was planned on). Thread-safe; hands out copies, so no caller can change a kept answer."""

    def __init__(self, size: int = DEFAULT_PREDICTIONS_KEPT, ttl_s: float = PREDICTION_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if size < 0 or ttl_s < 0:
            raise ValueError(f"predictions kept and their lifetime must be >= 0 (got {size}, {ttl_s} s)")
        self.size = size
        self.ttl_s = ttl_s
        self.clock = clock
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._pools: bytes | None = None
        self._kept: OrderedDict[bytes, tuple[float, predictor_pb2.PredictResponse]] = OrderedDict()

    @staticmethod
    def key(request: predictor_pb2.PredictRequest) -> bytes:
        return request.SerializeToString(deterministic=True)

    def get(self, request: predictor_pb2.PredictRequest) -> predictor_pb2.PredictResponse | None:
        key = self.key(request)
        with self._lock:
            self._for_pools(request)
            hit = self._kept.get(key)
            if hit is None or self.clock() - hit[0] > self.ttl_s:
                self._kept.pop(key, None)
                self.misses += 1
                return None
            self._kept.move_to_end(key)
            self.hits += 1
        out = predictor_pb2.PredictResponse()
        out.CopyFrom(hit[1])
        return out

    def put(self, request: predictor_pb2.PredictRequest, answer: predictor_pb2.PredictResponse) -> None:
        if not self.size:
            return
        kept = predictor_pb2.PredictResponse()
        kept.CopyFrom(answer)
        key = self.key(request)
        with self._lock:
            pools = self._pools_of(request)
            if self._pools is None:
                self._pools = pools
            elif pools != self._pools:
                return  # planned on pools other than the latest asked for: not worth keeping
            self._kept[key] = (self.clock(), kept)
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)

    @staticmethod
    def _pools_of(request: predictor_pb2.PredictRequest) -> bytes:
        return b"".join(p.SerializeToString(deterministic=True) for p in request.pools)

    def _for_pools(self, request: predictor_pb2.PredictRequest) -> None:
        """Forget every answer when ``request``'s pools are not the last asked for."""
        pools = self._pools_of(request)
        if pools != self._pools:
            self._kept.clear()
            self._pools = pools
