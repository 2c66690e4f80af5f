"""The oracle's step on a real GPU: ``torch.cuda.max_memory_allocated`` beside ``frenzy measure``.

Issue 36: on a tied embedding the end of the backward holds the head's gradient, the look-up's
and their sum (autograd's input buffer adds them out of place), which MARP did not charge. This
runs the oracle's own models (``frenzy.measure.models``) on CUDA with real tensors, SGD with
momentum in fp32, and prints the second iteration's peak minus what was allocated as it started --
plainly, and again inside a pass-through TorchDispatchMode like the oracle's tracker, to show that
the tracker's dispatch mode does not change what autograd allocates. On an H100 (torch 2.11,
2026-11-28) the plain and in-mode peaks were equal, and gpt2-L2-h256 s128 b2 under full recompute
rose 19.03 MiB above its start, the oracle's 41.09 - 22.06 MiB to the byte.

Run on a machine with a GPU and torch, from the repository root, with ``frenzy`` importable:
``python -m frenzy.measure.gpu_check`` (``cpu`` as an argument runs the steps without measuring).
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from frenzy.measure.models import build_model, loss_fn
from frenzy.measure.oracle import bert, gpt2, llama
from frenzy.measure.precision import Policy


class _PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def step_peak(spec, recompute: str, in_mode: bool, device: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(allocated as iteration 2 starts, its peak) of the oracle's step, SGD momentum, fp32, eager."""
    policy = Policy("fp32")
    model = build_model(spec, policy, "eager", recompute, "repeat", 0.0)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True)
    loss_of = loss_fn(spec)
    ids, labels = torch.randint(0, spec.vocab, (2, 128)), torch.randint(0, spec.vocab, (2, 128))

    def iteration() -> None:
        opt.zero_grad(set_to_none=True)
        with policy.region():
            logits = model(ids)
            loss = loss_of(logits, labels)
            del logits
        loss.backward()
        del loss
        opt.step()

    iteration()
    opt.zero_grad(set_to_none=True)
    if device != "cuda":
        iteration()
        return (0, 0)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if in_mode:
        with _PassThrough():
            iteration()
    else:
        iteration()
    torch.cuda.synchronize()
    return start, torch.cuda.max_memory_allocated()


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    torch.set_default_device(device)
    print(torch.__version__, torch.cuda.get_device_name() if device == "cuda" else device)
    for spec in (gpt2(), gpt2(4, 384, 6, vocab=8000), bert(), llama()):
        for recompute in ("full", "none"):
            a, b = step_peak(spec, recompute, False, device), step_peak(spec, recompute, True, device)
            print(f"{spec.name} eager recompute {recompute}: peak - start {(a[1] - a[0]) / 2**20:.3f} MiB "
                  f"(in a dispatch mode {(b[1] - b[0]) / 2**20:.3f} MiB)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
