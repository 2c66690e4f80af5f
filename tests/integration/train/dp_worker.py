"""torchrun worker for the uneven data-parallel test: a user's DDP loop with ``frenzy.train``.

Each rank trains its share of every global batch with the micro-batch and accumulation count the
launch contract gives it, scales its loss with ``share.scale`` and syncs once per step under
``share.sync``; after the steps it saves its parameters and the logged global losses to
``OUT/rank{R}.pt``. Arguments: OUT STEPS N_LAYERS.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import tiny_gpt  # the script's directory is on sys.path under torchrun
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import frenzy.train


def main(out: Path, steps: int, n_layers: int) -> None:
    # A mismatched collective (a rank syncing more often than another) fails in a minute, not 30.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    model = DistributedDataParallel(tiny_gpt.build(n_layers))
    opt = tiny_gpt.optimizer(model.parameters())
    share = frenzy.train.mixed_share(micro_batch=4, grad_accum=1)  # the recipe's values, overridden per rank
    rows = share.batch_rows()  # this rank's rows of each global batch; checks the group's shares
    m = share.micro_batch
    assert m is not None and share.global_batch is not None
    losses = []
    for step in range(steps):
        x, y = tiny_gpt.global_batch(step, share.global_batch)
        x, y = x[rows.start : rows.stop], y[rows.start : rows.stop]
        logged = torch.zeros((), dtype=torch.float64)
        for k in range(share.grad_accum):
            with share.sync(model, k):
                loss = share.scale(tiny_gpt.loss_fn(model(x[k * m : (k + 1) * m]), y[k * m : (k + 1) * m]))
                loss.backward()
            logged += loss.detach()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(logged, op=dist.ReduceOp.AVG)  # the global batch's mean loss (contract.py)
        losses.append(float(logged))
    params = {name: p.detach().clone() for name, p in model.module.named_parameters()}
    torch.save({"params": params, "losses": losses, "rows": (rows.start, rows.stop),
                "micro_batch": m, "grad_accum": share.grad_accum, "loss_factor": share.loss_factor},
               out / f"rank{dist.get_rank()}.pt")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
