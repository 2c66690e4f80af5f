"""Model specs several MARP test modules build on (as unit/has/has_builders.py does for HAS)."""

from __future__ import annotations

from marp import ModelSpec

# A small mixture-of-experts model: 8 experts, top-2 routing, Llama-style blocks.
MOE = ModelSpec(name="moe-tiny", family="custom", n_layers=8, hidden=1024, heads=8, kv_heads=8, ffn=2048,
                mlp="swiglu", vocab=32000, tied_embeddings=False, pos_emb="rope", max_positions=8192,
                norm="rmsnorm", bias=False, experts=8, top_k=2)  # fmt: skip
