"""A tiny training job that checkpoints to FRENZY_CHECKPOINT_DIR and resumes there, on any layout.

Frenzy gives every attempt of a job the same ``FRENZY_CHECKPOINT_DIR`` (the agents'
``--checkpoint-root``/<job id>). An attempt re-planned after an out-of-memory exit or a lost node
may run with another world size; this script saves with ``torch.distributed.checkpoint`` (DCP),
which writes each rank's shards with enough metadata to load them into any other sharding, so the
next attempt picks up where the last one saved, whatever its layout.

Run it through torchrun, as a Frenzy job (the agents add the rendezvous):

    frenzy submit --model gpt2-124m --seq-len 128 --global-batch 8 -- \\
        torchrun examples/train_resume.py --steps 40 --save-every 5

or by hand, moving it from two processes to one mid-run:

    export FRENZY_CHECKPOINT_DIR=/tmp/ckpt
    torchrun --standalone --nproc-per-node 2 examples/train_resume.py --steps 40 --stop-after 20
    torchrun --standalone --nproc-per-node 1 examples/train_resume.py --steps 40   # "resumed from step 20"

What it does:

* the model: a few linear layers, sharded with FSDP2 (``fully_shard``) over a CPU device mesh and
  gloo (``--wrap ddp``: DistributedDataParallel instead); CPU only, so it runs anywhere;
* the data: step ``s`` reads the global batch drawn from a generator seeded with ``s`` and each rank
  takes its equal slice of it, so the average gradient (and so the run) is the same for any world
  size that divides the global batch: a moved run continues the same trajectory;
* every ``--save-every`` steps (and at the end) DCP saves the model and optimizer (Adam: its moments
  and step count matter to continue) plus the step, into ``step-NNNNNNNN.tmp``, renamed to
  ``step-NNNNNNNN`` by rank 0 once every rank has written: a checkpoint cut short by a crash is
  never loaded. At start the newest complete one is loaded (``resumed from step N``);
* ``--stop-after N`` ends after step N (as if the job were stopped there); ``--oom-at N`` prints
  PyTorch's CUDA out-of-memory message after step N and exits 1 on attempt 1 (``FRENZY_ATTEMPT``),
  which the agents recognise and the scheduler re-plans;
* ``--report FILE`` (rank 0) writes JSON: the step resumed from, each step's loss, and the final
  parameters (full tensors), which a test compares with an uninterrupted run.

Without ``FRENZY_CHECKPOINT_DIR`` (or ``--checkpoint-dir``) it trains without checkpoints. Started
without torchrun it runs as a single process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path

STEP_DIR = re.compile(r"step-(\d{8})")
# As PyTorch's caching allocator words it (c10/cuda/CUDACachingAllocator.cpp, 2.1+).
OOM_MESSAGE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
               "capacity of 22.05 GiB of which 1.06 GiB is free.")


def latest_checkpoint(root: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` (its step and directory); None when there is none."""
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir()] \
        if root.is_dir() else []
    return max(found) if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="train until this many steps are done in all")
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--wrap", choices=("fsdp", "ddp"), default="fsdp")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("FRENZY_CHECKPOINT_DIR", ""))
    ap.add_argument("--stop-after", type=int, default=0, help="end after this step (0: run --steps)")
    ap.add_argument("--oom-at", type=int, default=0,
                    help="on attempt 1, after this step: print CUDA's out-of-memory message, exit 1")
    ap.add_argument("--report", default="", help="rank 0 writes the losses and final parameters here (JSON)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # a test machine runs several ranks on few cores
    store = ""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")  # env://: torchrun set RANK, WORLD_SIZE, MASTER_ADDR/PORT
    else:  # a plain `python train_resume.py`: a group of one (DCP and FSDP want a process group)
        fd, store = tempfile.mkstemp(prefix="train-resume-store-")
        os.close(fd)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        return train(args, dist)
    finally:
        dist.destroy_process_group()
        if store:
            Path(store).unlink(missing_ok=True)


def train(args: argparse.Namespace, dist: types.ModuleType) -> int:
    """The training loop (the process group is up); the exit status."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_state_dict,
    )

    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        print(f"--global-batch {args.global_batch} does not split over {world} ranks", file=sys.stderr)
        return 2
    tag = f"[rank {rank}/{world}]"

    torch.manual_seed(0)  # the same initial weights on every rank and in every fresh run
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 1))
    if args.wrap == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        trained = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model)
    opt = torch.optim.Adam(trained.parameters(), lr=args.lr)

    root = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    start = 0
    found = latest_checkpoint(root) if root is not None else None
    if found is not None:
        step, path = found
        # DCP loads in place: the state dicts describe this run's sharding, and it reads what each
        # rank needs from the saved shards, whatever layout saved them.
        model_sd, optim_sd = get_state_dict(trained, opt)
        state = {"model": model_sd, "optim": optim_sd, "meta": {"step": torch.tensor(0)}}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(trained, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["meta"]["step"])
        assert start == step, (start, step)
        print(f"{tag} resumed from step {start} ({path}), saved by another run; world size now {world}",
              flush=True)
    else:
        print(f"{tag} starting at step 0; no checkpoint in {root or '(no checkpoint dir)'}", flush=True)

    def save(step: int) -> None:
        assert root is not None
        final, tmp = root / f"step-{step:08d}", root / f"step-{step:08d}.tmp"
        model_sd, optim_sd = get_state_dict(trained, opt)
        dcp.save({"model": model_sd, "optim": optim_sd, "meta": {"step": torch.tensor(step)}},
                 checkpoint_id=str(tmp))
        dist.barrier()  # every rank's shards are written before the checkpoint counts
        if rank == 0:
            os.replace(tmp, final)
            print(f"{tag} saved step {step} to {final}", flush=True)
        dist.barrier()

    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(7)) / 4
    share = args.global_batch // world
    losses: dict[int, float] = {}
    last = args.steps if not args.stop_after else min(args.steps, args.stop_after)
    for step in range(start, last):
        x = torch.randn(args.global_batch, 16, generator=torch.Generator().manual_seed(10_000 + step))
        y = torch.tanh(x @ target * 3)
        mine = slice(rank * share, (rank + 1) * share)
        loss = torch.nn.functional.mse_loss(trained(x[mine]), y[mine])
        opt.zero_grad()
        loss.backward()  # FSDP reduce-scatters, DDP all-reduces: both average over the ranks
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses[step] = total.item() / world  # the global batch's loss
        if rank == 0:
            print(f"{tag} step {step} loss {losses[step]:.6f}", flush=True)
        done = step + 1
        if root is not None and (done % args.save_every == 0 or done == last):
            save(done)
        if args.oom_at and done == args.oom_at and os.environ.get("FRENZY_ATTEMPT", "1") == "1":
            dist.barrier()
            print(OOM_MESSAGE, file=sys.stderr, flush=True)
            return 1

    full = get_model_state_dict(trained, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        print(f"{tag} done at step {last}", flush=True)
        if args.report:
            Path(args.report).write_text(json.dumps({
                "resumed_from": start, "world": world, "losses": {str(k): v for k, v in losses.items()},
                "params": {k: v.flatten().tolist() for k, v in full.items()}}))
    # Every rank leaves together: gloo's teardown while a peer is still in a collective aborts
    # the process ("terminate called without an active exception"), seen 1 run in 6 without this.
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: gloo's C++ threads, torn down by destructors while a
    # peer rank is still closing its side, abort a process that had finished its work ("terminate
    # called without an active exception", SIGABRT after "done"; seen under a loaded CI even with
    # the barrier above). Everything this script writes is flushed and closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
