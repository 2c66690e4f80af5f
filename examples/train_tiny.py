"""A tiny real PyTorch training job for Frenzy: distributed data parallel over gloo, on CPU or GPU.

Run it through torchrun, as a Frenzy job (the agents add the rendezvous):

    frenzy submit --model gpt2-124m --seq-len 128 --global-batch 8 -- \\
        torchrun examples/train_tiny.py --steps 20 --micro-batch {micro_batch}

or by hand on one machine, two "nodes":

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29500 \\
        examples/train_tiny.py &
    torchrun --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29500 \\
        examples/train_tiny.py

Every rank prints its loss per step; at the end the ranks check that their
weights are identical (DDP kept them in sync) and rank 0 prints "ranks in sync".
``--fail-rank/--fail-step`` make one rank exit with ``--exit-code`` (to try
failure handling); ``--step-sleep`` slows the steps down (to try cancel).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--micro-batch", type=int, default=int(os.environ.get("FRENZY_MICRO_BATCH", "8") or 8))
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step")
    ap.add_argument("--fail-rank", type=int, default=-1, help="this global rank exits with --exit-code ...")
    ap.add_argument("--fail-step", type=int, default=0, help="... after this many steps")
    ap.add_argument("--exit-code", type=int, default=3)
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # a test machine runs several ranks on few cores
    dist.init_process_group("gloo")  # env:// — torchrun set RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    tag = f"[rank {rank}/{world} node {os.environ.get('FRENZY_NODE', os.environ.get('GROUP_RANK', '?'))}]"
    print(f"{tag} rendezvous ok at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}; "
          f"job {os.environ.get('FRENZY_JOB_ID', '-')} attempt {os.environ.get('FRENZY_ATTEMPT', '-')} "
          f"tp={os.environ.get('FRENZY_TP', '-')} dp={os.environ.get('FRENZY_DP', '-')} "
          f"micro_batch={args.micro_batch}", flush=True)

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    target = torch.randn(16, 1) / 4  # the function to learn: y = x @ target
    # Each rank its own shard of a small fixed dataset, read in micro-batches.
    shard = torch.randn(64, 16, generator=torch.Generator().manual_seed(1000 + rank))
    for step in range(args.steps):
        if rank == args.fail_rank and step == args.fail_step:
            print(f"{tag} failing on purpose at step {step} with exit code {args.exit_code}", flush=True)
            os._exit(args.exit_code)  # a crash: no clean shutdown of the process group
        start = (step * args.micro_batch) % shard.shape[0]
        x = shard[start:start + args.micro_batch]
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
        opt.zero_grad()
        loss.backward()  # gradients are all-reduced across every rank here
        opt.step()
        print(f"{tag} step {step} loss {loss.item():.4f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    lowest = flat.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    in_sync = bool(torch.allclose(spread, lowest))
    if rank == 0:
        print(f"{tag} {'ranks in sync' if in_sync else 'RANKS DIVERGED'} after {args.steps} steps", flush=True)
    dist.barrier()  # nobody tears gloo down while a peer still talks to it
    dist.destroy_process_group()
    return 0 if in_sync else 1


if __name__ == "__main__":
    sys.exit(main())
