"""torchrun worker for the uneven pipeline test: one stage of a TinyGPT per rank, blocks as the contract says.

The stage builds the full model from the shared seed and keeps the blocks ``share.blocks`` names
(embeddings on the first stage, norm and head on the last), runs GPipe over the contract's
micro-batches with the loss scaled by ``share.scale`` (and ``scale_grads=False``: the share already
divides by the number of micro-batches), and saves its last step's gradients and, on the last
stage, every step's loss to ``OUT/rank{R}.pt``. Arguments: OUT STEPS N_LAYERS.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import tiny_gpt  # the script's directory is on sys.path under torchrun
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import frenzy.train


def main(out: Path, steps: int, n_layers: int) -> None:
    # A mismatched collective (a rank syncing more often than another) fails in a minute, not 30.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    stages = dist.get_world_size()  # one pipeline, no data parallelism: W = 1
    share = frenzy.train.mixed_share(dp_size=1)
    assert share.contract is not None and share.global_batch is not None, "launched without the contract"
    blocks = share.blocks(n_layers)
    part = tiny_gpt.StagePart(tiny_gpt.build(n_layers), blocks)
    stage = PipelineStage(part, share.contract.stage, stages, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, share.grad_accum, scale_grads=False,
                             loss_fn=lambda out, target: share.scale(tiny_gpt.loss_fn(out, target)))  # fmt: skip
    opt = tiny_gpt.optimizer(part.parameters())
    losses, grads = [], {}
    for step in range(steps):
        x, y = tiny_gpt.global_batch(step, share.global_batch)
        if part.first:
            schedule.step(x)
        else:
            micro: list[torch.Tensor] = []
            schedule.step(target=y, losses=micro)
            losses.append(float(sum(loss.detach() for loss in micro)))  # the scaled micro-batch losses add up to the batch mean
        if step == steps - 1:
            grads = {name: p.grad.detach().clone() for name, p in part.named_parameters()}
        opt.step()
        opt.zero_grad()
    torch.save({"grads": grads, "losses": losses, "blocks": (blocks.start, blocks.stop),
                "params": {name: p.detach().clone() for name, p in part.named_parameters()}},
               out / f"rank{dist.get_rank()}.pt")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
