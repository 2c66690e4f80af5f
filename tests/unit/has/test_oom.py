"""has.oom: after an OOM, which plans of the job may still fit."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from has.oom import memory_share, oom_threshold, plans_that_may_fit

GiB = 1 << 30


@dataclass(frozen=True)
class P:
    name: str
    need: int  # predicted bytes per GPU
    gpu: int  # the GPU's memory


def share(p: P) -> float:
    return memory_share(p.need, p.gpu)


PLANS = [P("a100-1", 70 * GiB, 80 * GiB), P("a100-2-zero3", 40 * GiB, 80 * GiB), P("a100-2", 70 * GiB, 80 * GiB),
         P("h100-96", 84 * GiB, 96 * GiB), P("a40-4", 30 * GiB, 48 * GiB), P("a100-8", 12 * GiB, 80 * GiB)]


def test_the_failed_plan_and_every_plan_needing_as_much_go_and_the_order_stays() -> None:
    t = oom_threshold(None, 70 * GiB, 80 * GiB)  # a100-1 ran out of memory
    left = [p.name for p in plans_that_may_fit(PLANS, t, share)]
    # a100-2 needs as much per GPU; h100-96 needs the same share of a bigger GPU: both go.
    assert left == ["a100-2-zero3", "a40-4", "a100-8"]


def test_a_second_oom_only_lowers_the_bar() -> None:
    t = oom_threshold(None, 70 * GiB, 80 * GiB)
    t2 = oom_threshold(t, 40 * GiB, 80 * GiB)  # the ZeRO-3 plan failed too
    assert t2 == pytest.approx(0.5)
    assert [p.name for p in plans_that_may_fit(PLANS, t2, share)] == ["a100-8"]
    assert oom_threshold(t2, 79 * GiB, 80 * GiB) == t2  # an OOM of a bigger plan teaches nothing new


def test_no_oom_keeps_every_plan_and_bad_sizes_are_refused() -> None:
    assert plans_that_may_fit(PLANS, None, share) == PLANS
    with pytest.raises(ValueError, match="bytes must be >= 0"):
        memory_share(-1, 80 * GiB)
    assert memory_share(1, 0) == float("inf")
