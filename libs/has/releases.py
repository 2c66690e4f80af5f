"""When will ``n`` GPUs of a type be free? The release-time estimates of completion plan choice.

``Releases`` holds, per (GPU type, memory level), the sorted release time of every qualifying
GPU as a ``ReleaseList`` of runs; a pass commits each decision to it so later jobs do not count
on GPUs an earlier job already counts on (``QueuePolicy.plan_choice="completion"``).
"""

from __future__ import annotations

import bisect
from typing import final

from has.cluster import ClusterView
from has.placement import PlanOption

_INF = float("inf")


@final
class ReleaseList:
    """The release times of one (GPU type, memory level) — one per GPU — as runs: time
    ``times[j]`` (ascending, distinct) for ``counts[j]`` GPUs, live from run ``lo`` on;
    ``size`` GPUs in all (a commit takes as many as it gives back, so it never changes).

    Runs, not one entry per GPU: the GPUs of a running job share one release time, and so do
    the GPUs a decision claims, so a list of ~3,000 GPUs holds a few hundred runs. A commit
    then searches and shifts runs, not GPUs, and never builds ``n`` copies of its time; a
    lookup walks the few runs before the ``k``-th GPU (usually one or two).
    """

    __slots__ = ("times", "counts", "lo", "size")

    def __init__(self, times: list[float], counts: list[int]) -> None:
        """From ``ClusterView.release_runs`` (lists this object then owns and edits)."""
        self.times = times
        self.counts = counts
        self.lo = 0
        self.size = sum(counts)

    def at(self, k: int) -> float:
        """The (k + 1)-th earliest release time; inf when there are not that many GPUs."""
        if k >= self.size:
            return _INF
        counts = self.counts
        j = self.lo
        c = counts[j]
        while k >= c:
            k -= c
            j += 1
            c = counts[j]
        return self.times[j]

    def commit(self, n: int, until: float) -> None:
        """The ``n`` earliest-free GPUs are busy until ``until`` (nothing when fewer than n)."""
        if self.size < n:
            return
        counts, lo, left = self.counts, self.lo, n
        while left:  # take the n earliest from the front runs
            c = counts[lo]
            if c > left:
                counts[lo] = c - left
                break
            left -= c
            lo += 1
        self.lo = lo
        times = self.times
        pos = bisect.bisect_left(times, until, lo)  # give them back as one run at ``until``
        if pos < len(times) and times[pos] == until:
            counts[pos] += n
        else:
            times.insert(pos, until)
            counts.insert(pos, n)


@final
class Releases:
    """When will ``n`` GPUs of a type be free? A queue-aware estimate for plan choice.

    Per (GPU type, memory level): the sorted release time of every qualifying GPU — free =
    now, busy = its ``free_at``, unknown = never — from the snapshot
    (``ClusterView.release_runs``). Every decision of the pass is *committed* to it: a
    placement makes its GPUs busy until now + runtime; a job that chooses to wait for a plan
    claims the GPUs that free first until its own estimated end. So a job further down the
    queue does not count on GPUs an earlier job already counts on (without this, every job
    would wait for the same soon-free fast GPUs). TP groups are ignored here (an estimate;
    actual placement is ``choose_nodes``).

    ``lists[lid]`` is the list a plan draws from, ``lid`` the number ``lid(bytes, type)``
    gives its (type, memory level) — plans whose bytes fall in one level share one list; a
    need above every GPU of the type gets an empty list (no release ever: estimate inf,
    commits no-ops). The numbers are the capacity's (``_Capacity.release_ids``), so a job
    keeps its candidates' numbers from pass to pass (``has.queue_pass``, ``_Pass._lean``) and the pass's
    innermost loop indexes a list instead of hashing a key.
    """

    __slots__ = ("cluster", "now", "ids", "lists", "types")

    def __init__(self, cluster: ClusterView, now: float) -> None:
        self.cluster = cluster
        self.now = now
        self.ids = cluster._capacity.release_ids
        self.lists: list[ReleaseList] = []
        self.types: list[str] = []  # the GPU type of each list

    def load(self) -> list[ReleaseList]:
        """Every list numbered so far, built now (a few per GPU type: one per memory level
        some job needed), so that a job whose numbers are cached finds its lists built."""
        self._extend()
        return self.lists

    def _extend(self) -> None:
        keys = list(self.ids)  # (dicts keep insertion order: position = number)
        for gpu_type, level in keys[len(self.lists):]:
            times, counts = ([], []) if level is None else self.cluster.release_runs(gpu_type, level, self.now)
            self.lists.append(ReleaseList(times, counts))
            self.types.append(gpu_type)

    def lid(self, need_bytes: int, gpu_type: str) -> int:
        """The number of the list a plan needing ``need_bytes`` of ``gpu_type`` draws from."""
        key = (gpu_type, self.cluster.memory_level(gpu_type, need_bytes))
        lid = self.ids.get(key)
        if lid is None:
            lid = self.ids[key] = len(self.ids)
        if lid >= len(self.lists):
            self._extend()
        return lid

    def commit(self, plan: PlanOption, until: float, found: ReleaseList | None = None) -> None:
        """The ``plan.num_gpus`` earliest-free GPUs of its type are taken until ``until``
        (``found``: the plan's list when the caller already looked it up)."""
        if found is None:
            found = self.lists[self.lid(plan.bytes_per_gpu, plan.gpu_type)]
        found.commit(plan.num_gpus, until)
