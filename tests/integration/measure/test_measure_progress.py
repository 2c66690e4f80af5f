"""measure_layout's progress callback (what `frenzy measure`'s bar per rank is drawn from): each
chosen rank heard before it is measured with the count done so far, then (total, total, None)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from frenzy.measure import oracle  # noqa: E402
from frenzy.measure.config import MeasureConfig, ParallelConfig  # noqa: E402
from frenzy.measure.parallel import measure_layout  # noqa: E402


def test_one_rank_heard_before_and_after() -> None:
    small = oracle.llama(2, 128, 4, 2, 344, vocab=1024)
    calls: list[tuple[int, int, int | None]] = []
    out = measure_layout(small, MeasureConfig(128, 1, "pure-bf16"), ParallelConfig(),
                         progress=lambda done, total, rank: calls.append((done, total, rank)))  # fmt: skip
    assert [r.rank for r in out.ranks] == [0]
    assert calls == [(0, 1, 0), (1, 1, None)]
