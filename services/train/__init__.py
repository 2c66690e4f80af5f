"""Helpers for a user's training script under Frenzy: ``import frenzy.train``.

A mixed plan (one job over several GPU types) gives each rank its own micro-batch, accumulation
count, share of the global batch and, under a pipeline, its stage's blocks; the launcher says so in
five environment variables (``frenzy.train.contract``, which also holds the maths), and
``mixed_share()`` turns them into the two changes a DDP/FSDP loop needs (``frenzy.train.share``;
docs/mixed-plans.md, "Training a mixed plan"). Nothing here imports the server side, and torch only
inside the functions that need a process group, so the package imports anywhere.
"""

from frenzy.train.contract import NAMES, ContractError, RankContract, loss_shares, parse, render
from frenzy.train.share import MixedShare, mixed_share

__all__ = ["NAMES", "ContractError", "MixedShare", "RankContract", "loss_shares", "mixed_share", "parse", "render"]
