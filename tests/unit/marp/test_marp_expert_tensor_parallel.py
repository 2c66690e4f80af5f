"""Expert tensor parallelism (issue 16, --etp): the experts shard over an etp group of their own.

Megatron's experts run on their own grid over the same GPUs, pp x etp x ep x edp (default etp = tp):
a rank holds experts / ep of each MoE layer, each sharded 1 / etp; their gradients and optimizer
states shard over edp = tp x dp x cp / (etp x ep). The token dispatcher all-gathers the routed
tokens over the etp ranks, so the dispatch copies grow with etp (etp / tp of the full sequence).
"""

from __future__ import annotations

import pytest
from unit.marp.marp_builders import MOE

from marp import (
    GpuPool,
    InvalidLayoutError,
    InvalidRecipeError,
    Layout,
    ModelSpec,
    TrainingRecipe,
    enumerate_plans,
    get_model,
    predict_memory,
)

SEQ = 2048


def _mem(etp: int | None, zero: int = 1, recompute: str = "none") -> dict[str, int]:
    recipe = TrainingRecipe(seq_len=SEQ, global_batch=32, precision="master-bf16", ep=4)
    layout = Layout(tp=2, pp=1, dp=8, zero_stage=zero, micro_batch=1, grad_accum=4, ep=4, etp=etp, sp=True,
                    recompute=recompute)  # type: ignore[arg-type]  # fmt: skip
    return predict_memory(MOE, recipe, layout, "H100-80GB").to_dict()


def test_the_default_is_tp() -> None:
    assert _mem(None) == _mem(2)


def test_etp_1_keeps_whole_experts_and_shards_their_states_wider() -> None:
    experts = MOE.n_layers * MOE.expert_params()
    one, two = _mem(1), _mem(2)
    # bf16 parameters: experts / ep / etp on the rank -- twice as many with etp 1.
    assert one["parameters"] - two["parameters"] == pytest.approx(2 * experts / 4 * (1 - 1 / 2), rel=1e-6)
    # fp32 master + Adam states under ZeRO-1 shard over edp = tp dp / (etp ep): 4 with etp 1, 2 with
    # etp 2 -- the same bytes per rank either way (the whole grid holds each state once).
    assert one["optimizer_states"] == pytest.approx(two["optimizer_states"], rel=1e-6)


def test_dispatch_copies_grow_with_etp() -> None:
    # Full recompute saves only layer inputs; compare "none", where every layer's copies are kept.
    one, two = _mem(1), _mem(2)
    per_layer = SEQ * 2 * MOE.top_k * 2 * MOE.hidden * (2 - 1) / 2  # tokens x 2 copies x k x e h x (etp-1)/tp
    assert two["activations"] - one["activations"] == pytest.approx(MOE.n_layers * per_layer, rel=0.02)


@pytest.mark.parametrize(
    ("layout_kw", "model", "match"),
    [({"etp": 4, "ep": 4}, MOE, "must divide tp x dp x cp"), ({"etp": 1, "ep": 1}, get_model("llama-3.2-1b"),
                                                               "needs a mixture-of-experts")],
)  # fmt: skip
def test_bad_etp_names_the_field(layout_kw: dict[str, int], model: ModelSpec, match: str) -> None:
    recipe = TrainingRecipe(seq_len=SEQ, global_batch=8, precision="master-bf16")
    with pytest.raises(InvalidLayoutError, match=match) as info:
        predict_memory(model, recipe, Layout(tp=2, pp=1, dp=4, zero_stage=1, micro_batch=1, grad_accum=2, **layout_kw))
    assert info.value.field == "layout.etp"


def test_the_planner_keeps_the_jobs_etp() -> None:
    recipe = TrainingRecipe(seq_len=SEQ, global_batch=32, precision="master-bf16", ep=4, etp=1)
    plans = enumerate_plans(MOE, recipe, [GpuPool("H100-80GB", 32)], max_plans=None).plans
    assert plans and all(p.layout.expert_tp == 1 and p.layout.ep == 4 for p in plans)
    assert any(p.layout.tp > 1 for p in plans)
    for plan in plans[:5]:
        assert plan.memory == predict_memory(MOE, recipe, plan.layout, plan.gpu_type)
    with pytest.raises(InvalidRecipeError, match="recipe.etp"):
        enumerate_plans(get_model("llama-3.2-1b"), TrainingRecipe(seq_len=SEQ, global_batch=8, etp=1))
