"""The memory model, term by term, against hand computations from the cited formulas."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from marp import (
    InvalidLayoutError,
    InvalidRecipeError,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    TrainingRecipe,
    get_gpu,
    get_model,
    memory_grid,
    model_state_bytes,
    predict_memory,
)
from marp.gpus import GiB, MiB
from marp.memory import layer_activation_bytes

LLAMA7 = get_model("llama-2-7b")
PSI = LLAMA7.param_count()  # 6_738_415_616, divisible by 8


def _layout(dp: int = 1, zero: int = 0, tp: int = 1, pp: int = 1, mb: int = 1, ga: int = 8,
            rc: str = "none") -> Layout:  # fmt: skip
    return Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero, micro_batch=mb, grad_accum=ga, recompute=rc)


def _recipe(**kw: object) -> TrainingRecipe:
    base: dict[str, object] = {"seq_len": 1024, "global_batch": 8}
    base.update(kw)
    return TrainingRecipe(**base)  # type: ignore[arg-type]


def _gpt2_like(**over: object) -> ModelSpec:
    """The memory-notes B.5 setting: h = 1024, a = 16 (so as/h = 16 at s = 1024), GPT-2 style."""
    base = {"name": "gpt2-like", "family": "gpt2", "n_layers": 1, "hidden": 1024, "heads": 16,
            "kv_heads": 16, "ffn": 4096, "mlp": "gelu", "vocab": 50257, "tied_embeddings": True,
            "pos_emb": "learned", "max_positions": 1024, "norm": "layernorm", "bias": True,
            "qkv_bias": False, "dropout": 0.1}  # fmt: skip
    base.update(over)
    return ModelSpec(**base)  # type: ignore[arg-type]


# ---- model states ------------------------------------------------------------------------------


def test_mixed_precision_adam_is_16_bytes_per_param_without_zero() -> None:
    m = predict_memory(LLAMA7, _recipe(precision="bf16", optimizer="adamw"), _layout())
    assert (m.parameters, m.gradients, m.optimizer_states) == (2 * PSI, 2 * PSI, 12 * PSI)
    assert m.model_states == 16 * PSI


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("fp32", "adam", (4, 4, 8)),
        ("fp16", "adam", (2, 2, 12)),
        ("bf16", "sgd", (2, 2, 8)),
        ("fp32", "sgd", (4, 4, 4)),
    ],
)
def test_state_bytes_per_policy(precision: str, optimizer: str, per_param: tuple[int, int, int]) -> None:
    m = predict_memory(LLAMA7, _recipe(precision=precision, optimizer=optimizer), _layout())
    assert (m.parameters, m.gradients, m.optimizer_states) == tuple(b * PSI for b in per_param)


def test_zero_stages_at_dp8_follow_the_zero_paper() -> None:
    # Rajbhandari et al. 2020 Fig. 1 with K = 12, Nd = 8.
    assert sum(model_state_bytes(PSI, "bf16", "adamw", 0, 8)) == 16 * PSI
    assert sum(model_state_bytes(PSI, "bf16", "adamw", 1, 8)) == 4 * PSI + 12 * PSI // 8
    assert sum(model_state_bytes(PSI, "bf16", "adamw", 2, 8)) == 2 * PSI + 14 * PSI // 8
    assert sum(model_state_bytes(PSI, "bf16", "adamw", 3, 8)) == 16 * PSI // 8
    assert model_state_bytes(PSI, "bf16", "adamw", 2, 8) == (2 * PSI, 2 * PSI // 8, 12 * PSI // 8)


def test_zero_stages_through_predict_memory() -> None:
    def states(zero: int) -> int:
        return predict_memory(LLAMA7, _recipe(), _layout(dp=8, zero=zero, ga=1)).model_states

    assert states(0) == 16 * PSI
    assert states(1) == 4 * PSI + 12 * PSI // 8
    assert states(2) == 2 * PSI + 14 * PSI // 8
    # Stage 3 also holds the gathered working set: two layers' bf16 params (current + prefetch)
    # and one layer's unsharded bf16 grads. A Llama-2-7B layer is bigger than the vocab matrix.
    layer = LLAMA7.layer_params()
    assert layer > LLAMA7.vocab * LLAMA7.hidden
    assert states(3) == 16 * PSI // 8 + 2 * 2 * layer + 2 * layer
    # Each stage shards strictly more.
    assert states(0) > states(1) > states(2) > states(3)


def test_zero_is_a_no_op_without_data_parallelism() -> None:
    a = predict_memory(LLAMA7, _recipe(), _layout(zero=0))
    b = predict_memory(LLAMA7, _recipe(), _layout(zero=3))
    assert a == b


def test_tp_divides_layer_params_and_vocab_replicates_norms() -> None:
    # Megatron: per TP rank, sharded layer weights / t, norms replicated, embedding and head
    # vocab-parallel (32000 / 4 rows each), final norm replicated.
    t, h = 4, 4096
    sharded, replicated = LLAMA7.layer_params_split()
    assert sharded == 4 * h * h + 3 * h * 11008 and replicated == 2 * h
    per_rank = 32 * (sharded // t + replicated) + 2 * (32000 // t) * h + h
    m = predict_memory(LLAMA7, _recipe(), _layout(tp=t))
    assert m.parameters == 2 * per_rank
    assert m.optimizer_states == 12 * per_rank
    assert per_rank < PSI / t * 1.001


# ---- activations -------------------------------------------------------------------------------


def test_one_gpt2_layer_matches_korthikanti_without_flash() -> None:
    # Korthikanti et al. 2022 sec. 4.1: sbh(34 + 5as/h) bytes per layer (fp16, dropout).
    s, b, h, a = 1024, 2, 1024, 16
    m = _gpt2_like()
    expected = s * b * h * (34 + 5 * a * s / h)
    assert layer_activation_bytes(m, s, b, "bf16", flash_attention=False) == expected
    assert expected / (s * b * h) == 114  # memory-notes B.5, paper setting


def test_one_gpt2_layer_with_flash_is_34_sbh() -> None:
    # Flash attention keeps no s x s tensors: 34 sbh, plus its fp32 log-sum-exp (4 bytes per
    # head and query: memory-notes B.5 measured 34.07 sbh).
    s, b, h, a = 1024, 2, 1024, 16
    got = layer_activation_bytes(_gpt2_like(), s, b, "bf16", flash_attention=True)
    assert got == 34 * s * b * h + 4 * a * s * b


def test_korthikanti_tensor_parallel_formula() -> None:
    # Korthikanti eq. 2 (TP without sequence parallelism): sbh(10 + 24/t + 5as/(ht)).
    s, b, h, a, t = 1024, 1, 1024, 16, 4
    got = layer_activation_bytes(_gpt2_like(), s, b, "bf16", flash_attention=False, tp=t)
    assert got == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))


def test_no_dropout_variant() -> None:
    # Without dropout the masks and dropout outputs vanish: 32 + 2as/h (memory-notes B.5: 65 - 1 mask).
    s, h = 1024, 1024
    got = layer_activation_bytes(_gpt2_like(dropout=0.0), s, 1, "bf16", flash_attention=False)
    assert got == s * h * (32 + 2 * 16)


def test_fp32_doubles_every_activation_but_the_fp32_log_sum_exp() -> None:
    # memory-notes B.5: GPT-2 style flash, no dropout: 32.07 sbh in bf16, 64.08 sbh in fp32.
    s, h, a = 1024, 1024, 16
    m = _gpt2_like(dropout=0.0)
    lse = 4 * a * s
    assert layer_activation_bytes(m, s, 1, "bf16", True) == 32 * s * h + lse
    assert layer_activation_bytes(m, s, 1, "fp32", True) == 64 * s * h + lse


@pytest.mark.parametrize(("kv_heads", "measured"), [(16, 50.3), (4, 45.8)])
def test_llama_style_layer_against_measurement(kv_heads: int, measured: float) -> None:
    # memory-notes B.5: Llama-style (RMSNorm fp32, RoPE, SwiGLU f = 2816), bf16, flash, h = 1024.
    m = _gpt2_like(family="llama", kv_heads=kv_heads, ffn=2816, mlp="swiglu", pos_emb="rope",
                   norm="rmsnorm", bias=False, dropout=0.0)  # fmt: skip
    coef = layer_activation_bytes(m, 1024, 1, "bf16", True) / (1024 * 1024)
    assert coef == pytest.approx(measured, rel=0.01)


def test_per_layer_activations_through_predict_memory() -> None:
    # The notes' method: (L = 3 minus L = 1) / 2 is one layer.
    recipe = _recipe(flash_attention=False, global_batch=2)
    lay = _layout(mb=2, ga=1)
    one = predict_memory(_gpt2_like(n_layers=1), recipe, lay).activations
    three = predict_memory(_gpt2_like(n_layers=3), recipe, lay).activations
    assert (three - one) / 2 == 1024 * 2 * 1024 * (34 + 5 * 16)


def test_non_layer_activations_and_full_recompute() -> None:
    s, b, h, L = 1024, 2, 1024, 6
    model = _gpt2_like(n_layers=L)
    recipe = _recipe(global_batch=2)
    layer = layer_activation_bytes(model, s, b, "bf16", True)
    sbh = s * b * h
    non_layer = sbh * (1 + 2 * 2)  # embedding dropout mask (1 B) + final LayerNorm in/out (2 x 2 B)
    plain = predict_memory(model, recipe, _layout(mb=b, ga=1)).activations
    assert plain == int(np.ceil(L * layer + non_layer))
    # Full recompute: each layer keeps only its bf16 input (2sbh, Korthikanti sec. 4.2), plus one
    # layer's full activations while it is being recomputed.
    full = predict_memory(model, recipe, _layout(mb=b, ga=1, rc="full")).activations
    assert full == int(np.ceil(L * 2 * sbh + layer + non_layer))
    assert full < plain


def test_logits_term() -> None:
    # b*s*V/t x (2 B bf16 logits + 4 B fp32 log-softmax); fp32 run: 4 + 4.
    s, b, v = 1024, 2, 50257
    model = _gpt2_like(n_layers=2)
    bf16 = predict_memory(model, _recipe(global_batch=2), _layout(mb=b, ga=1))
    assert bf16.logits == b * s * v * 6
    tp2 = predict_memory(model, _recipe(global_batch=2), _layout(mb=b, ga=1, tp=2))
    assert tp2.logits == b * s * ((v + 1) // 2) * 6
    fp32 = predict_memory(model, _recipe(global_batch=2, precision="fp32"), _layout(mb=b, ga=1))
    assert fp32.logits == b * s * v * 8


def test_runtime_reserve() -> None:
    one = predict_memory(LLAMA7, _recipe(), _layout())
    many = predict_memory(LLAMA7, _recipe(), _layout(dp=8, ga=1))
    v100 = predict_memory(LLAMA7, _recipe(precision="fp16"), _layout(), gpu=get_gpu("V100-32GB"))
    assert one.runtime_reserve == 1 * GiB
    assert many.runtime_reserve == 1 * GiB + 512 * MiB
    assert v100.runtime_reserve == 1343 * MiB


def test_pipeline_first_stage_is_worst_and_holds_in_flight_micro_batches() -> None:
    recipe = _recipe(seq_len=4096, global_batch=8)
    m = predict_memory(LLAMA7, recipe, _layout(pp=4, ga=8))
    layer = layer_activation_bytes(LLAMA7, 4096, 1, "bf16", True)
    # First stage: 8 layers x min(pp, m) = 4 micro-batches in flight, embeddings, no logits.
    assert m.logits == 0
    assert m.activations == int(np.ceil(4 * 8 * layer))
    sharded, replicated = LLAMA7.layer_params_split()
    assert m.parameters == 2 * (8 * (sharded + replicated) + 32000 * 4096)
    # With fewer micro-batches than stages only those are in flight.
    m2 = predict_memory(LLAMA7, _recipe(seq_len=4096, global_batch=2), _layout(pp=4, ga=2))
    assert m2.activations == int(np.ceil(2 * 8 * layer))


def test_pipeline_last_stage_can_be_worst() -> None:
    # Huge vocab, one micro-batch: the last stage (head + logits) outweighs the first.
    model = dataclasses.replace(get_model("qwen2.5-0.5b"), name="q")
    m = predict_memory(model, _recipe(seq_len=4096, global_batch=1), _layout(pp=2, ga=1))
    assert m.logits == 4096 * 151936 * 6


def test_layout_must_match_model_and_recipe() -> None:
    with pytest.raises(InvalidLayoutError) as info:
        predict_memory(get_model("qwen2.5-0.5b"), _recipe(), _layout(tp=4))  # 14 heads, 2 kv heads
    assert info.value.field == "layout.tp"
    with pytest.raises(InvalidLayoutError) as info:
        predict_memory(LLAMA7, _recipe(global_batch=8), _layout(dp=2, ga=2))
    assert info.value.field == "layout.grad_accum"
    with pytest.raises(InvalidLayoutError) as info:
        predict_memory(get_model("gpt2-124m"), _recipe(), _layout(pp=16))
    assert info.value.field == "layout.pp"
    with pytest.raises(InvalidRecipeError) as info:
        predict_memory(get_model("gpt2-124m"), _recipe(seq_len=2048), _layout())
    assert info.value.field == "recipe.seq_len"


def test_breakdown_total_and_dict() -> None:
    mb = MemoryBreakdown(1, 2, 3, 4, 5, 6)
    assert mb.total == 21
    assert mb.to_dict() == {"parameters": 1, "gradients": 2, "optimizer_states": 3, "activations": 4,
                            "logits": 5, "runtime_reserve": 6, "total": 21}  # fmt: skip
    with pytest.raises(ValueError):
        MemoryBreakdown(-1, 0, 0, 0, 0, 0)


@pytest.mark.parametrize("name", ["gpt2-355m", "llama-3-8b", "qwen2.5-0.5b"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_vectorised_grid_agrees_with_scalar(name: str, precision: str) -> None:
    model = get_model(name)
    recipe = _recipe(
        global_batch=16, precision=precision, optimizer="adamw", flash_attention=name != "llama-3-8b"
    )
    rows = []
    for tp, pp, dp, zero, mb, rc in itertools.product((1, 2), (1, 2), (1, 2, 8), (0, 2, 3), (1, 2), (0, 1)):
        if 16 % (dp * mb) or model.heads % tp or model.kv_heads % tp:
            continue
        rows.append((tp, pp, dp, zero, mb, 16 // (dp * mb), rc))
    arr = np.array(rows)
    grid = memory_grid(model, recipe, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4], arr[:, 5],
                       arr[:, 6].astype(bool))  # fmt: skip
    assert len(rows) > 50
    for i, (tp, pp, dp, zero, mb, ga, rc) in enumerate(rows):
        lay = Layout(tp, pp, dp, zero, mb, ga, "full" if rc else "none")
        scalar = predict_memory(model, recipe, lay)
        assert scalar.to_dict() == {k: int(grid[k][i]) for k in scalar.to_dict()}, lay
