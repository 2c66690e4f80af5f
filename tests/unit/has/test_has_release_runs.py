"""The pass's release estimates kept as runs answer exactly as one entry per GPU would.

``ClusterView.release_runs`` must be ``release_times`` grouped into (time, GPU count) runs,
and ``releases.ReleaseList`` (runs, edited by commits) must give the same k-th earliest
release as the plain sorted list of one time per GPU that it replaced, after any sequence of
commits: take the n earliest, give n back at a later time. Decisions of the pass depend on
nothing else of these lists, so equal answers here mean equal decisions.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from unit.has.test_has_equivalence import random_cluster

from has import ClusterView
from has.releases import ReleaseList

INF = math.inf


def expand(times: list[float], counts: list[int]) -> list[float]:
    return [t for t, c in zip(times, counts, strict=True) for _ in range(c)]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), now=st.sampled_from([0.0, 500.0, 10_000.0, 20_000.0]), nan=st.booleans())
def test_release_runs_are_release_times_grouped(seed: int, now: float, nan: bool) -> None:
    rng = random.Random(seed)
    view = random_cluster(rng, 10_000.0)
    if nan:  # some busy GPUs' estimate is NaN, which reads as "free now"
        view = ClusterView([dataclasses.replace(n, gpus=tuple(
            dataclasses.replace(g, free_at=math.nan) if g.owner is not None and rng.random() < 0.3 else g
            for g in n.gpus)) for n in view.nodes])  # fmt: skip
    for gpu_type in view.gpu_types():
        levels = sorted({g.memory_total for n in view.nodes for g in n.gpus if g.gpu_type == gpu_type})
        for level in levels:
            times, counts = view.release_runs(gpu_type, level, now)
            assert expand(times, counts) == view.release_times(gpu_type, level, now)
            assert all(c >= 1 for c in counts)
            assert all(a < b for a, b in itertools.pairwise(times))  # distinct, ascending
            times.append(-1.0)  # the caller owns the lists: the view's cache is untouched
            assert expand(*view.release_runs(gpu_type, level, now)) == view.release_times(gpu_type, level, now)


release_time = st.one_of(st.sampled_from([0.0, 10.0, 10.0, 250.0, INF]), st.floats(0.0, 1e6))


@settings(max_examples=300, deadline=None)
@given(
    start=st.lists(release_time, max_size=40),
    steps=st.lists(
        st.tuples(st.integers(1, 12), st.floats(0.0, 2e6), st.lists(st.integers(0, 50), max_size=4)),
        max_size=30,
    ),
)
def test_release_list_matches_one_entry_per_gpu(
    start: list[float], steps: list[tuple[int, float, list[int]]]
) -> None:
    flat = sorted(start)
    times: list[float] = []
    counts: list[int] = []
    for t in flat:  # as ClusterView.release_runs groups them
        if times and times[-1] == t:
            counts[-1] += 1
        else:
            times.append(t)
            counts.append(1)
    runs = ReleaseList(times, counts)
    lo = 0  # the replaced structure: one entry per GPU, live from ``lo``
    for n, until, lookups in steps:
        for k in lookups:
            want = flat[lo + k] if lo + k < len(flat) else INF
            assert runs.at(k) == want
        if len(flat) - lo >= n:  # a commit: the n earliest are busy until ``until``
            lo += n
            pos = bisect.bisect_left(flat, until, lo)
            flat[pos:pos] = [until] * n
        runs.commit(n, until)
        assert runs.size == len(flat) - lo
        live = expand(runs.times[runs.lo :], runs.counts[runs.lo :])
        assert live == flat[lo:]
