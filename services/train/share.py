"""What a training script does with its share of a mixed plan: scale the loss, sync gradients once.

``mixed_share()`` reads the launch contract (``frenzy.train.contract``, which also holds the maths)
and returns a ``MixedShare``; a DDP/FSDP loop then changes in two places::

    share = frenzy.train.mixed_share(micro_batch=8, grad_accum=4)   # the recipe's own values
    for step in range(steps):
        for k in range(share.grad_accum):
            with share.sync(model, k):                  # no gradient sync but on the last micro-step
                share.scale(loss_fn(model(x_k), y_k)).backward()   # instead of loss / grad_accum
        optimizer.step(); optimizer.zero_grad()

Without the contract (a homogeneous job) the share is the recipe's own: ``scale`` divides by
``grad_accum``, ``sync`` is DDP's usual ``no_sync`` schedule, so training is exactly plain training.

torch is imported only inside the functions that talk to a process group, so that ``import
frenzy.train`` works where torch is not installed (the scheduler's side reads this package's names).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from frenzy.train.contract import ContractError, RankContract, parse

T = TypeVar("T")


@dataclass(frozen=True)
class MixedShare:
    """This rank's share of a step: its micro-batch, accumulation count and loss factor.

    ``contract`` is None for a homogeneous job; ``dp_size`` is W, the size of the group whose
    gradient reduction averages (DDP, FSDP)."""

    contract: RankContract | None
    micro_batch: int | None
    grad_accum: int
    dp_size: int

    def __post_init__(self) -> None:
        if isinstance(self.dp_size, bool) or not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise ContractError(f"dp_size must be a positive integer, got {self.dp_size!r}")
        if isinstance(self.grad_accum, bool) or not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ContractError(f"grad_accum must be a positive integer, got {self.grad_accum!r}")

    @property
    def mixed(self) -> bool:
        """Whether this rank runs a mixed plan's share (the contract is set)."""
        return self.contract is not None

    @property
    def local_batch(self) -> int | None:
        """b_i * m_i, the samples of one optimizer step on this rank (None when the micro-batch is unknown)."""
        return None if self.micro_batch is None else self.micro_batch * self.grad_accum

    @property
    def global_batch(self) -> int | None:
        """B: the contract's, or W * b_i * m_i for a homogeneous job (None when the micro-batch is unknown)."""
        if self.contract is not None:
            return int(self.contract.global_batch)
        return None if self.local_batch is None else self.local_batch * self.dp_size

    @property
    def loss_factor(self) -> float:
        """c_i = W * s_i / m_i, the weight of one micro-step's mean loss (1 / m_i, i.e. 1 / grad_accum, when homogeneous)."""
        if self.contract is None:
            return 1.0 / self.grad_accum
        return float(self.dp_size * self.contract.loss_scale / self.grad_accum)

    def scale(self, loss: T) -> T:
        """The micro-step's mean loss, weighted for an averaging gradient reduction; back-propagate this.

        It replaces the script's ``loss / grad_accum``, which must not be applied as well."""
        return cast(T, cast(Any, loss) * self.loss_factor)  # a tensor, or a float in a test

    def is_sync_step(self, micro_step: int) -> bool:
        """Whether gradients are reduced after this micro-step: only after the last one of a step."""
        if isinstance(micro_step, bool) or not isinstance(micro_step, int) or not 0 <= micro_step < self.grad_accum:
            raise ContractError(f"micro_step must be in 0..{self.grad_accum - 1}, got {micro_step!r}")
        return micro_step == self.grad_accum - 1

    def sync(self, model: Any, micro_step: int) -> contextlib.AbstractContextManager[None]:
        """The context to run micro-step ``micro_step``'s forward and backward in.

        Run the forward and the backward inside it. Every rank reduces its gradients once per
        optimizer step, after its last micro-step: under DDP (and ZeRO 0-2) ranks with different
        accumulation counts then issue the same collectives (one more reduction on one rank would
        pair with another rank's next one, or hang). Under FSDP / ZeRO-3 every micro-step also
        gathers parameters, so the plan gives all ranks the same count and only the micro-batch
        differs. DDP and FSDP1: ``model.no_sync()`` on the earlier micro-steps; FSDP2
        (``fully_shard``): ``set_requires_gradient_sync``; a model with neither (one process) needs
        nothing."""
        last = self.is_sync_step(micro_step)
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: a flag, read during backward
            return _gradient_sync(model, last)
        if not last and hasattr(model, "no_sync"):
            return model.no_sync()  # type: ignore[no-any-return]
        return contextlib.nullcontext()

    def blocks(self, n_layers: int) -> range:
        """The transformer blocks this rank builds: its stage's, or all ``n_layers`` without a pipeline."""
        if self.contract is None:
            return range(n_layers)
        if self.contract.last_layer >= n_layers:
            raise ContractError(f"FRENZY_STAGE_LAYERS={self.contract.first_layer}-{self.contract.last_layer} "
                                f"but the model has {n_layers} blocks (0-{n_layers - 1})")  # fmt: skip
        return self.contract.layers

    def batch_rows(self, group: Any = None) -> range:
        """This rank's rows of the global batch, ranks in group order; checks the group's shares.

        Collective: every rank of ``group`` (default: the whole world) calls it. It gathers each
        rank's local batch and raises ContractError unless they add up to the global batch that
        every rank's share implies, which catches a launcher that gave the group inconsistent
        shares before a single step is trained on them."""
        import torch
        import torch.distributed as dist

        if self.local_batch is None or self.global_batch is None:
            raise ContractError("batch_rows needs the micro-batch: mixed_share(micro_batch=...)")
        world = dist.get_world_size(group)
        if world != self.dp_size:
            raise ContractError(f"dp_size is {self.dp_size} but the group has {world} ranks")
        mine = torch.tensor([self.local_batch, self.global_batch], dtype=torch.int64)
        everyone = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine, group=group)
        batches = [int(t[0]) for t in everyone]
        totals = {int(t[1]) for t in everyone}
        if totals != {sum(batches)}:
            raise ContractError(f"the group's local batches {batches} add up to {sum(batches)}, but the ranks' "
                                f"shares imply global batches {sorted(totals)}")  # fmt: skip
        rank = dist.get_rank(group)
        start = sum(batches[:rank])
        return range(start, start + batches[rank])


@contextlib.contextmanager
def _gradient_sync(model: Any, enabled: bool) -> Iterator[None]:
    model.set_requires_gradient_sync(enabled)
    try:
        yield
    finally:
        # Leave the flag on, as FSDP2 starts: a later backward outside this helper still reduces.
        model.set_requires_gradient_sync(True)


def mixed_share(micro_batch: int | None = None, grad_accum: int = 1, dp_size: int | None = None,
                env: Mapping[str, str] | None = None) -> MixedShare:  # fmt: skip
    """This rank's share, from the launch contract in ``env`` (default: the process environment).

    ``micro_batch`` and ``grad_accum`` are the recipe's own, used when the contract is absent; a
    mixed plan's contract overrides them per rank. ``dp_size`` is W, the number of ranks whose
    gradients one reduction averages: by default ``WORLD_SIZE`` (torchrun sets it), right for DDP
    and FSDP; under pipeline parallelism pass the data-parallel width (world size / stages)."""
    env = os.environ if env is None else env
    contract = parse(env)
    if dp_size is None:
        world = env.get("WORLD_SIZE", "1")
        if not (world.isascii() and world.isdigit()) or int(world) < 1:
            raise ContractError(f"WORLD_SIZE={world!r}: expected a positive integer")
        dp_size = int(world)
    if contract is not None:
        micro_batch, grad_accum = contract.local_micro_batch, contract.local_grad_accum
    return MixedShare(contract=contract, micro_batch=micro_batch, grad_accum=grad_accum, dp_size=dp_size)
