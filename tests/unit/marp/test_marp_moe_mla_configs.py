"""Mixtral, Qwen2-MoE and DeepSeek-V2 / V3 config.json, and multi-head latent attention (issue 16).

Parameter counts from the config files match the published totals: Mixtral 8x7B 46.7B (Mistral AI
model card; Jiang et al. 2024 "47B"), Qwen1.5-MoE-A2.7B 14.3B (Qwen blog, "Qwen1.5-MoE"),
DeepSeek-V2-Lite 15.7B and DeepSeek-V2 236B (DeepSeek-AI 2024, sec. 1 and appendix B), DeepSeek-V3
671B (DeepSeek-AI 2024, V3 technical report, sec. 1; without the 14B multi-token-prediction module).
The configs below carry the keys of the public config.json files that decide the sizes.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from marp import (
    Layout,
    ModelConfigError,
    ModelSpec,
    TrainingRecipe,
    model_from_hf_config,
    model_from_json,
    predict_memory,
)

MIXTRAL = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768,
           "tie_word_embeddings": False}  # fmt: skip
QWEN_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
            "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
            "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
            "vocab_size": 151936, "max_position_embeddings": 8192, "tie_word_embeddings": False,
            "decoder_sparse_step": 1, "mlp_only_layers": []}  # fmt: skip
DSV2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "intermediate_size": 10944,
             "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
             "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_hidden_layers": 27, "num_attention_heads": 16,
             "num_key_value_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
             "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400, "max_position_embeddings": 163840,
             "tie_word_embeddings": False}  # fmt: skip
DSV2 = {**DSV2_LITE, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "n_routed_experts": 160, "num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128,
        "q_lora_rank": 1536}  # fmt: skip
DSV3 = {**DSV2, "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "num_hidden_layers": 61, "vocab_size": 129280}  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "published_b", "tol"),
    [(MIXTRAL, 46.7, 0.001), (QWEN_MOE, 14.3, 0.002), (DSV2_LITE, 15.7, 0.001), (DSV2, 236.0, 0.002),
     (DSV3, 671.0, 0.001)],
)  # fmt: skip
def test_parameter_counts_match_the_published_totals(cfg: dict, published_b: float, tol: float) -> None:
    spec = model_from_hf_config(cfg)
    assert spec.param_count() / 1e9 == pytest.approx(published_b, rel=tol)


def test_what_is_read() -> None:
    mixtral = model_from_hf_config(MIXTRAL)
    assert (mixtral.family, mixtral.experts, mixtral.top_k, mixtral.expert_ffn) == ("mixtral", 8, 2, 14336)
    qwen = model_from_hf_config(QWEN_MOE)
    assert (qwen.shared_ffn, qwen.qkv_bias, qwen.dense_layers) == (5632, True, 0)
    assert model_from_hf_config({**QWEN_MOE, "mlp_only_layers": [0, 5]}).dense_layers == 2
    v3 = model_from_hf_config({**DSV3, "model_type": "deepseek_v3", "architectures": None})
    assert (v3.mla, v3.kv_lora_rank, v3.q_lora_rank, v3.dense_layers, v3.shared_ffn) == (True, 512, 1536, 3, 2048)
    assert (v3.q_width, v3.v_width) == (128 * 192, 128 * 128)


def test_mla_attention_parameters() -> None:
    """DeepseekV2Attention without a query latent: q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj."""
    lite = model_from_hf_config(DSV2_LITE)
    h, heads = 2048, 16
    attn = (h * heads * 192 + h * (512 + 64) + 512 + 512 * heads * (128 + 128) + heads * 128 * h)
    sharded, replicated = lite.layer_params_split()
    shared = 3 * h * 2816
    assert sharded + replicated - 2 * h - h * 64 - shared == attn


def test_mla_in_the_neutral_spec_and_its_memory() -> None:
    neutral = {"arch": "decoder", "head": "lm", "n_layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8,
               "ffn": 2048, "mlp": "swiglu", "vocab": 32000, "tied_embeddings": False, "pos_emb": "rope",
               "max_positions": 4096, "norm": "rmsnorm", "bias": False, "kv_lora_rank": 256, "q_lora_rank": 384,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}  # fmt: skip
    mla = model_from_json(json.dumps(neutral))
    plain = model_from_json(json.dumps({k: v for k, v in neutral.items() if "lora" not in k and "head_dim" not in k}))
    recipe = TrainingRecipe(seq_len=2048, global_batch=1, micro_batch=1, precision="pure-bf16")
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch=1, grad_accum=1)
    a, b = predict_memory(mla, recipe, layout, "H100-80GB"), predict_memory(plain, recipe, layout, "H100-80GB")
    # Per head MLA keeps 192-wide Q and K and 128-wide V against 128 each: more activation bytes.
    assert a.activations > b.activations
    assert a.parameters == mla.param_count() * 2


@pytest.mark.parametrize(
    ("change", "field"),
    [({"kv_heads": 4}, "model.kv_heads"), ({"kv_lora_rank": 0}, "model.q_lora_rank"),
     ({"v_head_dim": 0}, "model.v_head_dim"), ({"bias": True}, "model.bias")],
)  # fmt: skip
def test_bad_mla_specs_name_the_field(change: dict, field: str) -> None:
    base = {"name": "x", "family": "custom", "n_layers": 2, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn": 1024,
            "mlp": "swiglu", "vocab": 100, "tied_embeddings": False, "pos_emb": "rope", "max_positions": 64,
            "norm": "rmsnorm", "bias": False, "kv_lora_rank": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16, "v_head_dim": 32}  # fmt: skip
    with pytest.raises(ModelConfigError) as info:
        ModelSpec(**{**base, **change})
    assert info.value.field == field


def test_moe_only_keys_need_experts() -> None:
    with pytest.raises(ModelConfigError, match="needs experts"):
        ModelSpec(name="x", family="custom", n_layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, mlp="swiglu",
                  vocab=100, tied_embeddings=False, pos_emb="rope", max_positions=64, norm="rmsnorm", bias=False,
                  shared_ffn=128)  # fmt: skip
    with pytest.raises(ModelConfigError) as info:
        model_from_hf_config({**DSV2_LITE, "first_k_dense_replace": 27})
    assert info.value.field == "model.config.first_k_dense_replace"


def test_deepseek_v3_over_uneven_virtual_stages() -> None:
    """Issue 36: DeepSeek-V3's 61 layers at pp 8 x vpp 2 (16 virtual stages, which do not divide 61)
    run with torchtitan's balanced split -- 3, 4 x 14, 2 -- instead of being refused, and cost what
    the same split given explicitly does."""
    from marp.recipe import balanced_split

    v3 = model_from_hf_config(DSV3)
    recipe = TrainingRecipe(seq_len=4096, global_batch=128, micro_batch=1, precision="bf16")
    layout = Layout(tp=8, pp=8, dp=16, zero_stage=1, micro_batch=1, grad_accum=8, vpp=2, ep=16,
                    recompute="full", sp=True)  # fmt: skip
    split = balanced_split(61, 16)
    assert split == (3,) + (4,) * 14 + (2,)
    got = predict_memory(v3, recipe, layout, "H100-80GB")
    assert got == predict_memory(v3, replace(recipe, pp_layers=split), replace(layout, pp_layers=split), "H100-80GB")
    assert got.activations > 0 and got.parameters > 0
