"""Which unpacked code trees a node drops (codecache.choose_evictions): unused too long, then the
least recently used until the rest fit. No I/O."""

from __future__ import annotations

import pytest

from frenzy.agent.codecache import DAY_S, CachedTree, CachePolicy, choose_evictions

NOW = 100 * DAY_S


def tree(sha: str, size: int, days_ago: float) -> CachedTree:
    return CachedTree(sha, size, NOW - days_ago * DAY_S)


def test_trees_unused_past_the_age_go_and_the_rest_stay_when_they_fit() -> None:
    policy = CachePolicy(max_bytes=1000, max_age_s=7 * DAY_S)
    trees = [tree("old", 10, 8), tree("recent", 10, 1), tree("edge", 10, 7)]
    assert choose_evictions(trees, policy, NOW) == ["old", "edge"]


def test_over_the_size_the_least_recently_used_go_until_the_rest_fit() -> None:
    policy = CachePolicy(max_bytes=250, max_age_s=30 * DAY_S)
    trees = [tree("a", 100, 3), tree("b", 100, 1), tree("c", 100, 2), tree("d", 100, 0)]
    assert choose_evictions(trees, policy, NOW) == ["a", "c"]  # 400 -> 200 bytes: b and d, the newest, stay
    assert choose_evictions(trees, CachePolicy(max_bytes=0, max_age_s=30 * DAY_S), NOW) == ["a", "c", "b", "d"]
    assert choose_evictions([], policy, NOW) == []


def test_a_policy_that_keeps_nothing_for_no_time_is_refused() -> None:
    with pytest.raises(ValueError, match="ages above 0"):
        CachePolicy(max_age_s=0)
    with pytest.raises(ValueError, match="max_bytes >= 0"):
        CachePolicy(max_bytes=-1)
