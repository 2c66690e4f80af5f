"""Precision policies of the measured step, with CUDA autocast emulated on the CPU build.

``torch.autocast("cuda")`` is silently disabled without CUDA, and CPU autocast casts a different
set of ops (memory-notes B.6, pitfall 2), so the measured models call the casts themselves, the
way CUDA autocast would (aten/src/ATen/autocast_mode.cpp, the CUDA op lists):

* "lower precision" ops (linear, matmul, scaled_dot_product_attention) get bf16 inputs;
* "fp32" ops (layer_norm, softmax, log_softmax, pow, rsqrt) get fp32 inputs;
* every other op (embedding, gelu, silu, mul, add, tanh) runs in its inputs' dtype, so the
  residual stream stays fp32 (embedding output) and additions promote bf16 + fp32 to fp32.

Autocast caches the bf16 copy of a leaf tensor that requires grad (a weight) for the whole
autocast region (``cached_cast``: fp32, requires_grad, leaf, not a view), so each weight is
cast once per forward and the copy lives until the region exits or, when a matmul saved it,
until that matmul's backward. ``Policy.region`` is that region; activation checkpointing
re-enters a fresh one for its recomputation (torch.utils.checkpoint restores the autocast
state around the recompute), which the runner wires through checkpoint's ``context_fn``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from frenzy.measure.config import POLICIES


@dataclass
class Policy:
    """How parameters are stored and how ops cast under one precision policy."""

    name: str
    _cache: dict[int, torch.Tensor] | None = field(default=None, repr=False)
    _depth: int = 0

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"precision must be one of {', '.join(POLICIES)}, got {self.name!r}")

    @property
    def amp(self) -> bool:
        return self.name == "amp-bf16"

    @property
    def param_dtype(self) -> torch.dtype:
        # Pure bf16 creates parameters in bf16 (module.to(dtype) fails under FakeTensorMode,
        # pitfall 3); fp32 and AMP keep fp32 parameters.
        # fsdp-bf16: FSDP2 casts its fp32 shards to bf16 when it all-gathers them.
        return torch.bfloat16 if self.name == "pure-bf16" else torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float32 if self.name == "fp32" else torch.bfloat16

    # ---- autocast emulation ------------------------------------------------------------------

    @contextlib.contextmanager
    def region(self) -> Iterator[None]:
        """An autocast region: the weight-cast cache lives until the outermost region exits."""
        if self._depth == 0:
            self._cache = {}
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._cache = None

    def low(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """Argument of a lower-precision op (linear, matmul, SDPA)."""
        if t is None or not self.amp or t.dtype == torch.bfloat16:
            return t
        cacheable = t.requires_grad and t.is_leaf and self._cache is not None
        if not cacheable:
            return t.to(torch.bfloat16)
        cached = self._cache.get(id(t))
        if cached is None:
            cached = t.to(torch.bfloat16)
            self._cache[id(t)] = cached
        return cached

    def f32(self, t: torch.Tensor) -> torch.Tensor:
        """Argument of an fp32 op (layer_norm, softmax, pow, rsqrt) under autocast."""
        if self.amp and t.dtype != torch.float32:
            return t.float()
        return t


__all__ = ["POLICIES", "Policy"]
