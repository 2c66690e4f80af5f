"""A tiny GPT and its data for the mixed-plan equivalence tests, shared by the torchrun workers and
the single-process references.

Everything is float64 and seeded, so that the distributed run and the reference differ only by the
order of floating-point sums (~1e-16): the 1e-5 tolerance then tests the maths of the loss shares,
not rounding. The model is a pre-norm decoder (token and position embeddings, blocks of causal
self-attention and an MLP, a final norm and an untied head), split into pipeline stages by
``StagePart``, which keeps the original parameter names so a stage's gradients compare name by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 48
SEQ = 8
DIM = 16
HEADS = 2
SEED = 1234


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(DIM, dim=-1)
        q, k, v = (z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class StagePart(nn.Module):
    """The blocks ``layers`` of a TinyGPT, with the embeddings on the first stage and the norm and
    head on the last; parameter names are the full model's (``blocks.3.qkv.weight``)."""

    def __init__(self, full: TinyGPT, layers: range) -> None:
        super().__init__()
        n = len(full.blocks)
        self.first, self.last = layers.start == 0, layers.stop == n
        if self.first:
            self.tok, self.pos = full.tok, full.pos
        self.blocks = nn.ModuleDict({str(i): full.blocks[i] for i in layers})
        if self.last:
            self.norm, self.head = full.norm, full.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


def build(n_layers: int) -> TinyGPT:
    """The same initial weights in every process."""
    torch.manual_seed(SEED)
    return TinyGPT(n_layers).to(torch.float64)


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: ``size`` sequences, inputs and next-token targets."""
    gen = torch.Generator().manual_seed(SEED * 1000 + step)
    tokens = torch.randint(0, VOCAB, (size, SEQ + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy of a (micro-)batch, as a user's script computes it."""
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


LR = 0.2
MOMENTUM = 0.9


def optimizer(params: object) -> torch.optim.Optimizer:
    """SGD with momentum: a gradient error shows in the parameters as it is (Adam would normalise a
    uniform scale error away), so the parameter check also checks the gradients' scale."""
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)  # type: ignore[arg-type]
