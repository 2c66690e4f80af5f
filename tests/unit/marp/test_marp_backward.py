"""MARP's per-tensor refinements found with the fake-tensor oracle (frenzy measure), term by term.

Each test pins one physical fact (cited in marp.activations / marp.memory) with a hand-computed
value; tests/integration/measure checks the whole model against measurements."""

from __future__ import annotations

import pytest

from marp import InvalidRecipeError, Layout, ModelSpec, TrainingRecipe, predict_memory
from marp.activations import layer_coefficients

H, A = 256, 4


def _spec(**over: object) -> ModelSpec:
    base = {"name": "t", "family": "custom", "n_layers": 2, "hidden": H, "heads": A, "kv_heads": A, "ffn": 4 * H,
            "mlp": "gelu", "vocab": 4096, "tied_embeddings": True, "pos_emb": "learned", "max_positions": 1024,
            "norm": "layernorm", "bias": True}  # fmt: skip
    base.update(over)
    return ModelSpec(**base)  # type: ignore[arg-type]


def _llama(**over: object) -> ModelSpec:
    kw: dict[str, object] = {"mlp": "swiglu", "ffn": 688, "pos_emb": "rope", "norm": "rmsnorm", "bias": False,
                             "tied_embeddings": False}  # fmt: skip
    kw.update(over)
    return _spec(**kw)


def _one_gpu(spec: ModelSpec, seq: int = 256, mb: int = 2, rc: str = "none", **recipe: object):  # type: ignore[no-untyped-def]
    r = TrainingRecipe(seq_len=seq, global_batch=mb, micro_batch=mb, kernels="eager", loss="torch",
                       optimizer_impl="foreach", dropout=0.0, **recipe)  # type: ignore[arg-type]  # fmt: skip
    return predict_memory(spec, r, Layout(1, 1, 1, 0, mb, 1, recompute=rc))  # type: ignore[arg-type]


def test_rotary_embeddings_keep_nothing_of_q_and_k() -> None:
    # q * cos + rotate_half(q) * sin: cos / sin need no grad, so autograd's mul saves neither q nor k.
    rope = layer_coefficients(_llama(), "pure-bf16", True, 0.0)
    learned = layer_coefficients(_llama(pos_emb="learned"), "pure-bf16", True, 0.0)
    assert (rope.rep, rope.par) == (learned.rep, learned.par)


def test_grouped_kv_is_repeated_by_eager_kernels_and_eager_attention() -> None:
    gqa = _llama(heads=8, kv_heads=2)
    kv = gqa.kv_dim
    native = layer_coefficients(gqa, "pure-bf16", True, 0.0, kv_repeat=False)
    repeated = layer_coefficients(gqa, "pure-bf16", True, 0.0, kv_repeat=True)
    assert repeated.par - native.par == 2 * 2 * (H - kv)  # K and V h-wide instead of kv-wide
    eager = layer_coefficients(gqa, "pure-bf16", False, 0.0, kv_repeat=False)
    assert eager.par == repeated.par - 4 * 8  # eager repeats regardless; no flash log-sum-exp
    assert TrainingRecipe(seq_len=8, global_batch=1, kernels="eager").resolved_kv_repeat
    assert not TrainingRecipe(seq_len=8, global_batch=1, kernels="fused").resolved_kv_repeat
    assert not TrainingRecipe(seq_len=8, global_batch=1, kv_repeat=False).resolved_kv_repeat
    with pytest.raises(InvalidRecipeError) as info:
        TrainingRecipe(seq_len=8, global_batch=1, kv_repeat="yes")  # type: ignore[arg-type]
    assert info.value.field == "recipe.kv_repeat"


@pytest.mark.parametrize(("spec", "policy", "per_key"), [
    (_spec(), "pure-bf16", 2),  # GPT-2 / BERT: softmax in the compute dtype
    (_llama(), "pure-bf16", 4 + 2),  # HF LLaMA: fp32 softmax output + bf16 copy for P @ V
    (_llama(), "fp32", 4),  # the .to(fp32) copy is a no-op
    (_spec(), "amp-bf16", 4 + 2),  # autocast: softmax is an fp32 op
])  # fmt: skip
def test_eager_softmax_bytes_per_score(spec: ModelSpec, policy: str, per_key: int) -> None:
    assert layer_coefficients(spec, policy, False, 0.0).score == A * per_key


def test_attention_dropout_saves_its_output_instead_of_the_copy() -> None:
    # softmax fp32 (4) + mask (1) + dropout output in bf16 (2): the bf16 copy feeds dropout, unsaved
    assert layer_coefficients(_llama(), "pure-bf16", False, 0.1).score == A * (4 + 1 + 2)
    assert layer_coefficients(_spec(), "pure-bf16", False, 0.1).score == A * (2 + 1 + 2)  # Korthikanti 5as/h


def test_autocast_casts_the_norm_output_once_per_reading_linear() -> None:
    # Autocast caches casts of weights only: three q/k/v projections (LLaMA, BERT) save three bf16
    # copies of the fp32 norm output, GPT-2's fused c_attn one; SwiGLU's gate and up two.
    gpt2 = layer_coefficients(_spec(family="gpt2"), "amp-bf16", True, 0.0)
    bert = layer_coefficients(_spec(family="bert", arch="encoder", type_vocab=2), "amp-bf16", True, 0.0)
    llama = layer_coefficients(_llama(), "amp-bf16", True, 0.0)
    llama_gelu = layer_coefficients(_llama(mlp="gelu", ffn=4 * H), "amp-bf16", True, 0.0)
    assert bert.rep - gpt2.rep == 2 * 2 * H
    assert llama.rep - llama_gelu.rep == 2 * H
    assert layer_coefficients(_llama(), "pure-bf16", True, 0.0).rep == 2 * (4 + 2 + 2) * H + 2 * 4


def test_autocast_copies_matmul_weights_only() -> None:
    spec = _llama()
    m = _one_gpu(spec, precision="amp-bf16")
    linears = 2 * (spec.layer_params() - 2 * H) + spec.vocab * H  # layers' linears + LM head
    assert m.buffers == 2 * linears  # token embedding and norms stay fp32


def test_backward_holds_head_grads_then_the_larger_of_layer_grads_and_saved_activations() -> None:
    # Full recompute: a layer's checkpoint (4 B x h per token) is smaller than its fp32 gradients
    # (4 B x 12h^2), so the backward peaks in the first layer's recomputed backward, with every later
    # layer's gradients (transient grads); with persistent grads all gradients are there all along.
    spec = _spec(n_layers=4, vocab=512, tied_embeddings=False)
    kw: dict[str, object] = {"seq": 512, "mb": 2, "rc": "full", "optimizer": "sgd", "precision": "fp32"}
    transient = _one_gpu(spec, **kw)
    persistent = _one_gpu(spec, **kw, grad_buffer="persistent")
    assert transient.phase == persistent.phase == "backward"
    g_layer = 4 * spec.layer_params()
    head = 4 * (spec.vocab * H + 2 * H)  # untied LM head + final LayerNorm
    assert transient.gradients == head + 3 * g_layer
    assert persistent.gradients == 4 * spec.param_count()
    more = _one_gpu(_spec(n_layers=5, vocab=512, tied_embeddings=False), **kw)
    # one more layer adds its parameters and one layer of gradients (not of activations)
    assert more.peak_allocated - transient.peak_allocated == pytest.approx(8 * spec.layer_params(), abs=64)


def test_tied_embedding_gradient_is_briefly_tripled_at_the_end_of_backward() -> None:
    # Plain SGD has no optimizer temporaries; the look-up's gradient of a tied embedding exists beside
    # the head's, and autograd's input buffer sums the two out of place before AccumulateGrad takes
    # the sum (issue 36: frenzy measure and an H100 agree): 2 x V x h x 4 B beyond the gradients;
    # with the gradients persistent the sum is then added into .grad, 3 x.
    spec = _spec(n_layers=1, vocab=8192)
    m = _one_gpu(spec, seq=16, mb=1, optimizer="sgd", precision="fp32")
    assert m.phase == "backward"
    assert m.peak_allocated == 8 * spec.param_count() + 2 * 4 * spec.vocab * H
    kept = _one_gpu(spec, seq=16, mb=1, optimizer="sgd", precision="fp32", grad_buffer="persistent")
    assert kept.phase == "backward"
    assert kept.peak_allocated == 8 * spec.param_count() + 3 * 4 * spec.vocab * H


def test_full_recompute_under_autocast_frees_the_layer_copies_after_the_forward() -> None:
    # Checkpointed layers drop their saved weight copies when the autocast region exits; only the
    # head's outlives it. The forward's end is then the larger of: inside the region (every copy,
    # the loss forward's bf16 logits + fp32 upcast + log-softmax, 10 B per logit) and after it (the
    # head's copy, 12 B per logit at the start of the loss backward).
    tokens = 512
    for vocab, inside in ((4096, True), (32000, False)):
        spec = _llama(n_layers=4, vocab=vocab)
        m = _one_gpu(spec, precision="amp-bf16", optimizer="sgd", rc="full")
        layer_copies = 4 * 2 * (spec.layer_params() - 2 * H)
        head_copy = 2 * vocab * H
        assert m.phase == "forward+loss"
        assert m.buffers == (layer_copies + head_copy if inside else head_copy)
        assert m.logits == tokens * vocab * (10 if inside else 12)
