"""torch.compile and float8 linears (issue 16, --compile and --float8).

compile: Inductor's min-cut partitioner recomputes pointwise ops in the backward instead of saving
their outputs, which MARP models as fused kernels (the norms keep their input and statistics,
SwiGLU its gate and up projections): a Llama layer saves 0.71x the bytes in bf16, 0.66x under
autocast. float8: FSDP2 gathers the matmul weights in fp8 (torchao's float8 all-gather), eager
Float8Linear casts the layer being computed, Transformer Engine keeps an fp8 copy and its
transpose of every weight; a GPU without fp8 tensor cores is refused by name.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from marp import (
    GpuPool,
    Layout,
    TrainingRecipe,
    UnsupportedPrecisionError,
    enumerate_plans,
    get_model,
    predict_memory,
)
from marp.activations import layer_coefficients

LLAMA = get_model("llama-3-8b")
LINEARS = LLAMA.layer_params() - 2 * LLAMA.norm_params()  # one layer's matmul weights
GIB = 1024**3


def _mem(precision: str, zero: int, dp: int, **kw: object) -> dict[str, int]:
    recipe = TrainingRecipe(seq_len=8192, global_batch=dp, micro_batch=1, precision=precision, **kw)  # type: ignore[arg-type]
    layout = Layout(tp=1, pp=1, dp=dp, zero_stage=zero, micro_batch=1, grad_accum=1)
    return predict_memory(LLAMA, recipe, layout, "H100-80GB").to_dict()


@pytest.mark.parametrize(("policy", "factor"), [("fsdp-bf16", 0.712), ("pure-bf16", 0.712), ("amp-bf16", 0.662)])
def test_compile_saves_a_layers_pointwise_outputs(policy: str, factor: float) -> None:
    eager = layer_coefficients(LLAMA, policy, True, 0.0, fused=False, kv_repeat=True)
    fused = layer_coefficients(LLAMA, policy, True, 0.0, fused=True, kv_repeat=True)
    assert (fused.rep + fused.par) / (eager.rep + eager.par) == pytest.approx(factor, abs=0.001)
    eager_mem = _mem(policy, 3 if policy == "fsdp-bf16" else 0, 8 if policy == "fsdp-bf16" else 1)
    compiled = _mem(policy, 3 if policy == "fsdp-bf16" else 0, 8 if policy == "fsdp-bf16" else 1, compile=True)
    assert compiled["activations"] < 0.8 * eager_mem["activations"]
    assert compiled["parameters"] == eager_mem["parameters"]


def test_compile_is_the_fused_kernels_memory_model() -> None:
    recipe = TrainingRecipe(seq_len=4096, global_batch=8, micro_batch=1, precision="fsdp-bf16", kv_repeat=True)
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch=1, grad_accum=1)
    compiled = predict_memory(LLAMA, replace(recipe, compile=True), layout, "H100-80GB")
    assert compiled == predict_memory(LLAMA, replace(recipe, kernels="fused"), layout, "H100-80GB")
    assert compiled.total < predict_memory(LLAMA, recipe, layout, "H100-80GB").total


def test_float8_all_gather_halves_the_gathered_matmul_weights() -> None:
    plain, fp8 = _mem("fsdp-bf16", 3, 8), _mem("fsdp-bf16", 3, 8, float8=True)
    # The peak is at the loss (8k tokens of a 128k vocabulary), where one unit is gathered -- the
    # last block, which torchtitan does not reshard after its forward -- its matmul weights at
    # 1 B instead of 2.
    recipe = TrainingRecipe(seq_len=8192, global_batch=8, micro_batch=1, precision="fsdp-bf16")
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch=1, grad_accum=1)
    assert predict_memory(LLAMA, recipe, layout, "H100-80GB").phase == "forward+loss"
    assert plain["buffers"] - fp8["buffers"] == 1 * LINEARS * (2 - 1)
    assert fp8["parameters"] == plain["parameters"]  # the fp32 shards are unchanged


def test_eager_float8_linear_casts_one_layer() -> None:
    plain, fp8 = _mem("amp-bf16", 0, 1), _mem("amp-bf16", 0, 1, float8=True)
    assert fp8["buffers"] - plain["buffers"] == 2 * LINEARS


def test_transformer_engine_keeps_fp8_weight_copies() -> None:
    plain, fp8 = _mem("master-bf16", 1, 8), _mem("master-bf16", 1, 8, float8=True)
    assert fp8["buffers"] - plain["buffers"] == LLAMA.n_layers * LINEARS * 2
    assert fp8["total"] - plain["total"] >= LLAMA.n_layers * LINEARS * 2


def test_float8_needs_fp8_tensor_cores() -> None:
    recipe = TrainingRecipe(seq_len=4096, global_batch=8, micro_batch=1, precision="fsdp-bf16", float8=True)
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch=1, grad_accum=1)
    with pytest.raises(UnsupportedPrecisionError, match="A100-80GB cannot run float8") as info:
        predict_memory(LLAMA, recipe, layout, "A100-80GB")
    assert info.value.field == "recipe.float8"
    plans = enumerate_plans(LLAMA, recipe, [GpuPool("A100-80GB", 16), GpuPool("H100-80GB", 16)])
    assert plans.plans and {p.gpu_type for p in plans.plans} == {"H100-80GB"}
    assert any(line.startswith("A100-80GB: no fp8 support") for line in plans.rejected)


def test_lora_targets_choose_the_adapted_linears() -> None:
    """--lora-targets (issue 16): adapters on more linears cost more; a MoE layer's MLP targets
    adapt every expert."""
    from marp import ModelSpec
    from marp.sizes import lora_params

    def lora(targets: tuple[str, ...]) -> int:
        recipe = TrainingRecipe(seq_len=2048, global_batch=1, micro_batch=1, precision="pure-bf16", finetune="lora",
                                lora_rank=16, lora_targets=targets)  # fmt: skip
        return predict_memory(LLAMA, recipe, Layout(1, 1, 1, 0, 1, 1), "H100-80GB").optimizer_states

    attn, every = lora(("q", "k", "v", "o")), lora(("q", "k", "v", "o", "gate", "up", "down"))
    h, f = LLAMA.hidden, LLAMA.ffn
    # peft's fp32 adapters under pure-bf16, Adam: two fp32 states per adapter parameter, r (d_in + d_out) per matrix.
    assert every - attn == pytest.approx(LLAMA.n_layers * 16 * 3 * (h + f) * 2 * 4, rel=1e-6)
    moe = ModelSpec(name="moe", family="custom", n_layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, mlp="swiglu",
                    vocab=100, tied_embeddings=False, pos_emb="rope", max_positions=64, norm="rmsnorm", bias=False,
                    experts=8, top_k=2)  # fmt: skip
    assert lora_params(moe, 4, ("up",)) == 8 * 4 * (64 + 128)
