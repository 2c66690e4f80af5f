"""The parts of a submission that run without Redis: plans rendered once per content. (The
queued-jobs quota is checked by the write itself: tests/security/test_limits.py.)"""

from __future__ import annotations

import json

from frenzy.scheduler.service import PlansJson
from frenzy.state.store import plans_to_json
from support.state import make_plan


def test_plans_are_rendered_once_per_content_and_as_the_store_writes_them() -> None:
    kept = PlansJson(size=2)
    a = [make_plan("A100-80GB", dp=1), make_plan("A100-80GB", dp=2)]
    first = kept.render(a)
    assert first == plans_to_json(a) and json.loads(first)[1]["numGpus"] == 2
    assert kept.render([make_plan("A100-80GB", dp=1), make_plan("A100-80GB", dp=2)]) is first  # same content
    other = kept.render([make_plan("H100-80GB")])
    assert other != first and json.loads(other)[0]["gpuType"] == "H100-80GB"
    kept.render([make_plan("L4")])  # size 2: the oldest is dropped, and rendered again when asked
    assert kept.render(a) == first and kept.render(a) is not first
