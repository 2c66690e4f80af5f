"""The cluster file's ``price_per_gpu_hour`` per node group (issue 35): parsed, bounded, and the
price a GPU type's plans pay (the highest of its groups')."""

from __future__ import annotations

import pytest

from has.cluster_spec import ClusterSpecError, parse_cluster


def test_a_group_price_is_kept_and_overrides_by_type() -> None:
    spec = parse_cluster({"nodes": [
        {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 4, "price_per_gpu_hour": 1.5},
        {"gpu": "L4", "count": 2, "gpus_per_node": 2},
        {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8, "name_prefix": "a100b", "price_per_gpu_hour": 2},
        {"gpu": "T4", "count": 1, "price_per_gpu_hour": 0},
    ]})  # fmt: skip
    assert [g.price_per_gpu_hour for g in spec.groups] == [1.5, None, 2.0, 0.0]
    # Two A100 groups at different rates: a plan may land on either, so a budget uses the higher.
    assert spec.price_overrides() == {"A100-80GB": 2.0, "T4": 0.0}


@pytest.mark.parametrize("bad", [-1, "3", True, float("nan"), float("inf"), 2e6])
def test_a_bad_price_names_the_entry_and_field(bad: object) -> None:
    with pytest.raises(ClusterSpecError, match=r"nodes\[0\]\.price_per_gpu_hour: must be a number of dollars"):
        parse_cluster({"nodes": [{"gpu": "L4", "price_per_gpu_hour": bad}]})


def test_without_prices_nothing_is_overridden() -> None:
    assert parse_cluster({"nodes": [{"gpu": "L4"}]}).price_overrides() == {}
