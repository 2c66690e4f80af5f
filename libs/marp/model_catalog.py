"""Catalog of well-known models with their exact published hyper-parameters.

Every entry is transcribed from the model's official Hugging Face ``config.json``
(the repository is named next to it) so that ``param_count()`` reproduces the
published parameter counts exactly. Look-ups are case-insensitive and also accept
the Hugging Face repository id (``meta-llama/Llama-2-7b-hf``) or its last part.
"""

from __future__ import annotations

import difflib

from marp.errors import UnknownModelError
from marp.models import ModelSpec


def _gpt2(name: str, n_layers: int, hidden: int, heads: int) -> ModelSpec:
    # GPT-2 (Radford et al. 2019); HF GPT2Config: vocab_size 50257, n_positions 1024,
    # n_inner null (= 4 * n_embd), activation gelu_new, LayerNorm, biases everywhere,
    # LM head tied to wte, resid/embd/attn_pdrop 0.1.
    return ModelSpec(
        name=name, family="gpt2", n_layers=n_layers, hidden=hidden, heads=heads, kv_heads=heads,
        ffn=4 * hidden, mlp="gelu", vocab=50257, tied_embeddings=True, pos_emb="learned",
        max_positions=1024, norm="layernorm", bias=True, qkv_bias=False, dropout=0.1,
    )  # fmt: skip


def _llama(
    name: str, family: str, n_layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
    vocab: int, max_positions: int, tied: bool = False, qkv_bias: bool = False,
) -> ModelSpec:  # fmt: skip
    # LLaMA-style decoder (Touvron et al. 2023): RMSNorm, RoPE, SwiGLU, no linear biases
    # (Qwen2 adds q/k/v biases), dropout 0 (attention_dropout 0.0 in every config below).
    return ModelSpec(
        name=name, family=family, n_layers=n_layers, hidden=hidden, heads=heads,  # type: ignore[arg-type]
        kv_heads=kv_heads, ffn=ffn, mlp="swiglu", vocab=vocab, tied_embeddings=tied,
        pos_emb="rope", max_positions=max_positions, norm="rmsnorm", bias=False,
        qkv_bias=qkv_bias, dropout=0.0,
    )  # fmt: skip


# (spec, aliases). Aliases are the HF repository ids, matched case-insensitively.
_ENTRIES: tuple[tuple[ModelSpec, tuple[str, ...]], ...] = (
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json: n_layer 12, n_embd 768, n_head 12
    (_gpt2("gpt2-124m", 12, 768, 12), ("openai-community/gpt2", "gpt2")),
    # https://huggingface.co/openai-community/gpt2-medium/blob/main/config.json: 24, 1024, 16
    (_gpt2("gpt2-355m", 24, 1024, 16), ("openai-community/gpt2-medium", "gpt2-medium")),
    # https://huggingface.co/openai-community/gpt2-large/blob/main/config.json: 36, 1280, 20
    (_gpt2("gpt2-774m", 36, 1280, 20), ("openai-community/gpt2-large", "gpt2-large")),
    # https://huggingface.co/openai-community/gpt2-xl/blob/main/config.json: 48, 1600, 25
    (_gpt2("gpt2-1.5b", 48, 1600, 25), ("openai-community/gpt2-xl", "gpt2-xl")),
    # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
    (_llama("llama-2-7b", "llama", 32, 4096, 32, 32, 11008, 32000, 4096), ("meta-llama/llama-2-7b-hf",)),
    # https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json
    (_llama("llama-2-13b", "llama", 40, 5120, 40, 40, 13824, 32000, 4096), ("meta-llama/llama-2-13b-hf",)),
    # https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json (GQA, 8 kv heads)
    (_llama("llama-2-70b", "llama", 80, 8192, 64, 8, 28672, 32000, 4096), ("meta-llama/llama-2-70b-hf",)),
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    (_llama("llama-3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192), ("meta-llama/meta-llama-3-8b",)),
    # https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
    (_llama("llama-3-70b", "llama", 80, 8192, 64, 8, 28672, 128256, 8192), ("meta-llama/meta-llama-3-70b",)),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json (128k context)
    (
        _llama("llama-3.1-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 131072),
        ("meta-llama/llama-3.1-8b", "meta-llama/meta-llama-3.1-8b"),
    ),
    # https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
    (
        _llama("llama-3.1-70b", "llama", 80, 8192, 64, 8, 28672, 128256, 131072),
        ("meta-llama/llama-3.1-70b", "meta-llama/meta-llama-3.1-70b"),
    ),
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json (tied embeddings)
    (
        _llama("llama-3.2-1b", "llama", 16, 2048, 32, 8, 8192, 128256, 131072, tied=True),
        ("meta-llama/llama-3.2-1b",),
    ),
    # https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json (tied embeddings)
    (
        _llama("llama-3.2-3b", "llama", 28, 3072, 24, 8, 8192, 128256, 131072, tied=True),
        ("meta-llama/llama-3.2-3b",),
    ),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    (
        _llama("mistral-7b", "mistral", 32, 4096, 32, 8, 14336, 32000, 32768),
        ("mistralai/mistral-7b-v0.1", "mistral-7b-v0.1"),
    ),
    # https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json (tied, q/k/v bias)
    (
        _llama("qwen2.5-0.5b", "qwen2", 24, 896, 14, 2, 4864, 151936, 32768, tied=True, qkv_bias=True),
        ("qwen/qwen2.5-0.5b",),
    ),
    # https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json
    (
        _llama("qwen2.5-1.5b", "qwen2", 28, 1536, 12, 2, 8960, 151936, 131072, tied=True, qkv_bias=True),
        ("qwen/qwen2.5-1.5b",),
    ),
    # https://huggingface.co/Qwen/Qwen2.5-3B/blob/main/config.json
    (
        _llama("qwen2.5-3b", "qwen2", 36, 2048, 16, 2, 11008, 151936, 32768, tied=True, qkv_bias=True),
        ("qwen/qwen2.5-3b",),
    ),
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    (
        _llama("qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 131072, qkv_bias=True),
        ("qwen/qwen2.5-7b",),
    ),
    # https://huggingface.co/Qwen/Qwen2.5-14B/blob/main/config.json
    (
        _llama("qwen2.5-14b", "qwen2", 48, 5120, 40, 8, 13824, 152064, 131072, qkv_bias=True),
        ("qwen/qwen2.5-14b",),
    ),
    # https://huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json
    (
        _llama("qwen2.5-32b", "qwen2", 64, 5120, 40, 8, 27648, 152064, 131072, qkv_bias=True),
        ("qwen/qwen2.5-32b",),
    ),
    # https://huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json
    (
        _llama("qwen2.5-72b", "qwen2", 80, 8192, 64, 8, 29568, 152064, 131072, qkv_bias=True),
        ("qwen/qwen2.5-72b",),
    ),
)

_BY_KEY: dict[str, ModelSpec] = {}
for _spec, _aliases in _ENTRIES:
    for _key in (_spec.name, *_aliases):
        _BY_KEY[_key.lower()] = _spec
        # "org/Name" is also found by its last part ("Llama-2-7b-hf").
        _BY_KEY.setdefault(_key.lower().rsplit("/", 1)[-1], _spec)


def list_models() -> list[ModelSpec]:
    """Every catalog model, in catalog order."""
    return [spec for spec, _ in _ENTRIES]


def find_model(name: str) -> ModelSpec | None:
    """The catalog model called ``name`` (case-insensitive, HF ids accepted), or None."""
    if not isinstance(name, str):
        return None
    return _BY_KEY.get(name.strip().lower())


def suggest_models(name: str, n: int = 5) -> list[str]:
    """Catalog names close to ``name`` (difflib), best first."""
    names = [spec.name for spec, _ in _ENTRIES]
    close = difflib.get_close_matches(str(name).strip().lower(), names, n=n, cutoff=0.5)
    return close


def get_model(name: str) -> ModelSpec:
    """The catalog model called ``name``; UnknownModelError (with close names) otherwise."""
    spec = find_model(name)
    if spec is not None:
        return spec
    close = suggest_models(name)
    hint = f"Did you mean {', '.join(close)}? " if close else ""
    raise UnknownModelError(
        "model",
        f"unknown model {name!r}. {hint}Catalog: {', '.join(s.name for s in list_models())}.",
        "use a catalog name, a path to a config.json, or the config as inline JSON.",
    )


__all__ = ["find_model", "get_model", "list_models", "suggest_models"]
