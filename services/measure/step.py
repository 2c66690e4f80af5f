"""One measured training step on fake tensors: ``measure(spec, config) -> Measurement``.

The model of ``frenzy.measure.models`` is built under FakeTensorMode on the CPU device (fake
CUDA tensors make autograd abort on a CPU-only build, memory-notes B.6 pitfall 1), then two
training iterations run -- zero_grad, forward + loss inside the (emulated) autocast region,
backward, optimizer step -- and the second is reported (the first allocates the optimizer
states; pitfall 7). ``LiveBytes`` counts every live storage during the second iteration from
its start, with the parameters, the optimizer states and the input batch already live, exactly
what ``torch.cuda.reset_peak_memory_stats`` then ``max_memory_allocated`` around one step of a
warmed-up loop would report.

CUDA behaviour emulated on the CPU build:

* optimizers use the foreach implementation, the CUDA default, which is not the CPU default
  (pitfall 6): foreach AdamW's ``exp_avg_sq.sqrt()`` is a state-sized temporary (memory-notes D.3);
* Adam's ``step`` counters are excluded: with foreach and capturable=False torch.optim keeps them
  on the host (torch/optim/adam.py, "Deliberately host `step` on CPU");
* allocations are rounded to 512 B (the caching allocator's granularity, pitfall 7);
* autocast and its weight-cast cache (``frenzy.measure.precision``, pitfall 2).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from frenzy.measure.config import GRAD_BUFFERS, OPTIMIZER_IMPLS, OPTIMIZERS, MeasureConfig
from frenzy.measure.models import build_model, loss_fn
from frenzy.measure.precision import Policy
from frenzy.measure.tracker import LiveBytes
from marp import ModelSpec

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer_states", "other")


@dataclass(frozen=True)
class Measurement:
    """Peak of live tensor bytes in the second iteration, and its split at that moment.

    ``breakdown`` has ``parameters``, ``gradients`` (``.grad`` tensors), ``optimizer_states``
    (momentum / variance buffers) and ``other`` (activations, logits, autocast weight copies,
    activation gradients and optimizer temporaries). ``phase_peaks`` is the highest total seen
    in each phase: forward+loss (up to the logits' gradient, the loss's backward included, as in
    MARP's phase A), backward (the layers'), optimizer.
    """

    model: str
    config: MeasureConfig
    peak_bytes: int
    breakdown: dict[str, int]
    phase: str
    phase_peaks: dict[str, int]
    param_count: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["config"] = asdict(self.config)
        return out


def _optimizer(name: str, params: list[torch.nn.Parameter], impl: str) -> torch.optim.Optimizer:
    # torch defaults otherwise (AdamW weight decay 0.01, SGD without weight decay); foreach=True as
    # torch.optim picks on CUDA (torch/optim/optimizer.py, _default_to_fused_or_foreach).
    foreach = impl == "foreach"
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2, foreach=foreach)
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=foreach)


def state_split(tr: LiveBytes, params: Iterable[Any], trainable: Iterable[Any], opt: Any) -> dict[str, int]:
    """The live bytes ``tr`` counts, split as MARP's terms: the parameters, the gradients of the
    ``trainable`` ones, the optimizer's states, and everything else (activations, transients)."""
    split = {
        "parameters": sum(tr.bytes_of(p) for p in params),
        "gradients": sum(tr.bytes_of(p.grad) for p in trainable),
        "optimizer_states": sum(tr.bytes_of(t) for t in _state_tensors(opt)),
    }
    split["other"] = tr.current - sum(split.values())
    return split


def _state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for st in opt.state.values() for k, v in st.items() if k != "step" and isinstance(v, torch.Tensor)]


def measure(spec: ModelSpec, config: MeasureConfig) -> Measurement:
    """Measure one training step of ``spec`` under ``config`` on fake tensors (a few seconds)."""
    started = time.perf_counter()
    if config.precision == "fsdp-bf16":
        raise ValueError("fsdp-bf16 is FSDP2's mixed precision: measure it on dp x cp > 1 ranks "
                         "(frenzy.measure.parallel)")  # fmt: skip
    policy = Policy(config.precision)
    b, s = config.micro_batch, config.seq_len
    if spec.pos_emb == "learned" and s > spec.max_positions:
        raise ValueError(f"seq_len {s} exceeds {spec.name}'s {spec.max_positions} learned positions")
    with FakeTensorMode():
        model = build_model(spec, policy, config.attention, config.recompute, config.gqa, config.dropout)
        params = list(model.parameters())
        opt = _optimizer(config.optimizer, params, config.optimizer_impl)
        compute_loss = loss_fn(spec)
        ids = torch.randint(0, spec.vocab, (b, s))
        if spec.head == "classifier":
            labels = torch.randint(0, spec.num_labels, (b,))
        else:
            labels = torch.randint(0, spec.vocab, (b, s))

        def iteration(tracker: LiveBytes | None) -> None:
            def phase(name: str) -> None:
                if tracker is not None:
                    tracker.set_phase(name)

            opt.zero_grad(set_to_none=set_to_none)
            phase("forward+loss")
            with policy.region():
                logits = model(ids)
                # The loss's own backward belongs to "forward+loss" (MARP's phase A ends at the start
                # of the loss backward); the layers' backward starts once the logits' gradient exists.
                logits.register_hook(lambda grad: phase("backward"))
                loss = compute_loss(logits, labels)
                del logits  # the caller frees the logits (torchtitan / torchtune ``del pred``)
            loss.backward()
            del loss
            phase("optimizer")
            opt.step()

        set_to_none = config.grad_buffer == "transient"
        iteration(None)
        opt.zero_grad(set_to_none=set_to_none)  # as iteration 2 starts (freed, or zeroed and kept)

        def classify(tr: LiveBytes) -> dict[str, int]:
            return state_split(tr, params, params, opt)

        tracker = LiveBytes(config.round_bytes, classify)
        tracker.track([*params, *(p.grad for p in params), *_state_tensors(opt), ids, labels])
        tracker.peak = tracker.current
        tracker.peak_breakdown = classify(tracker)
        with tracker:
            iteration(tracker)
    notes = []
    if spec.dropout != config.dropout:
        notes.append(f"{spec.name}'s config trains with dropout {spec.dropout}; measured with {config.dropout}")
    return Measurement(
        model=spec.name, config=config, peak_bytes=tracker.peak, breakdown=dict(tracker.peak_breakdown),
        phase=tracker.peak_phase, phase_peaks=dict(tracker.phase_peaks), param_count=sum(p.numel() for p in params),
        seconds=round(time.perf_counter() - started, 3), notes=notes,
    )  # fmt: skip


__all__ = ["CATEGORIES", "GRAD_BUFFERS", "OPTIMIZERS", "OPTIMIZER_IMPLS", "MeasureConfig", "Measurement", "measure"]
