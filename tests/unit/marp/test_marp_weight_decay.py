"""Weight decay: the recipe's field, its per-optimizer default, and the SGD step's temporary.

torch's SGD (with or without momentum) allocates a gradient-sized copy in its step only when
weight decay is non-zero (torch/optim/sgd.py, ``_foreach_add(grads, params, alpha=weight_decay)``);
MARP used to charge it always, 20-33 % over an exact fake-tensor step of SGD with momentum.
"""

from __future__ import annotations

import dataclasses

import pytest

from marp import InvalidRecipeError, Layout, TrainingRecipe, get_model, predict_memory


@pytest.mark.parametrize(("optimizer", "default"), [("adamw", 0.01), ("adam", 0.0), ("sgd", 0.0),
                                                    ("sgd-momentum", 0.0), ("adam8bit", 0.0)])  # fmt: skip
def test_default_is_the_optimizers_own(optimizer: str, default: float) -> None:
    recipe = TrainingRecipe(seq_len=128, global_batch=2, optimizer=optimizer)  # type: ignore[arg-type]
    assert recipe.resolved_weight_decay == default
    assert recipe.to_dict()["weight_decay"] == default
    assert dataclasses.replace(recipe, weight_decay=0.1).resolved_weight_decay == 0.1


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.1", True])
def test_bad_weight_decay_is_refused_by_name(bad: object) -> None:
    with pytest.raises(InvalidRecipeError) as info:
        TrainingRecipe(seq_len=128, global_batch=2, weight_decay=bad)  # type: ignore[arg-type]
    assert info.value.field == "recipe.weight_decay"


def _optimizer_step(optimizer: str, weight_decay: float | None, impl: str = "foreach") -> tuple[int, int]:
    """(transient, gradients) at the peak of a single-GPU fp32 step (fully recomputed, so the
    optimizer step is the peak whenever it allocates)."""
    model = get_model("gpt2")
    recipe = TrainingRecipe(seq_len=128, global_batch=1, micro_batch=1, precision="fp32",
                            optimizer=optimizer, weight_decay=weight_decay, optimizer_impl=impl)  # type: ignore[arg-type]  # fmt: skip
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch=1, grad_accum=1, recompute="full")
    mem = predict_memory(model, recipe, layout)
    return (mem.transient if mem.phase == "optimizer" else 0), mem.gradients


@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum"])
def test_sgd_allocates_only_for_weight_decay(optimizer: str) -> None:
    transient, grads = _optimizer_step(optimizer, None)
    assert transient == 0  # torch's default: weight decay 0, the step is in place (not the peak)
    transient, grads = _optimizer_step(optimizer, 0.1)
    assert transient == grads  # the gradient-sized copy grads + wd x params


def test_adam_temporary_does_not_depend_on_weight_decay() -> None:
    # exp_avg_sq_sqrt is allocated either way; Adam's L2 copy is freed before it.
    assert _optimizer_step("adam", 0.0) == _optimizer_step("adam", 0.1)
    assert _optimizer_step("adamw", None) == _optimizer_step("adamw", 0.0)


@pytest.mark.parametrize("precision", ["fp32", "pure-bf16", "amp-bf16"])
def test_sgd_momentum_matches_the_fake_tensor_step(precision: str) -> None:
    """Exact check against ``frenzy measure`` (torch.optim.SGD(momentum=0.9), weight decay 0)."""
    pytest.importorskip("torch")
    from frenzy.measure import compare
    from frenzy.measure.oracle import _case, llama
    from frenzy.measure.step import measure

    case = _case(llama(3, 512, 8, 2, 1376, vocab=8000), 128, 2, precision, optimizer="sgd-momentum")
    measured = measure(case.model, case.config)
    predicted = compare.predict(case.model, case.config)
    assert abs(compare.error_pct(predicted.peak_allocated, measured.peak_bytes)) < 1.0
