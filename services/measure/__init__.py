"""``frenzy measure``: a measured dry run of one training step, MARP's oracle.

Builds the model of a ``marp.ModelSpec`` as plain torch modules on fake tensors (no weights, no
memory), runs two real training iterations (forward, loss, backward, optimizer step) with CUDA's
behaviour emulated where the CPU build differs, and reports the peak of live tensor bytes of the
second one with its split into parameters, gradients, optimizer states and the rest -- the
quantity MARP's ``peak_allocated`` predicts (``torch.cuda.max_memory_allocated``).

Modules: ``config`` (what one measured step is; torch-free), ``tracker`` (live storage bytes, a
TorchDispatchMode), ``precision`` (policies and CUDA autocast emulation), ``models`` (GPT-2, LLaMA and BERT styles), ``step`` (the measured
iteration), ``compare`` (MARP's prediction for the same configuration; torch-free) and
``oracle`` (the configurations the tests check). ``parallel`` is the multi-GPU oracle: each rank
of a dp x tp x cp layout (FSDP2, DTensor TP, ring-attention CP, peft LoRA) on PyTorch's fake
process group. torch is an optional dependency (the ``train`` extra); importing this package does
not import it.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from frenzy.measure.step import MeasureConfig, Measurement
    from marp import ModelSpec

INSTALL_HINT = "pip install -e .[train]"


class TorchMissingError(RuntimeError):
    """torch is not installed; frenzy measure needs the ``train`` extra."""


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def peft_available() -> bool:
    """peft (the ``train`` extra) builds the multi-GPU oracle's LoRA adapters."""
    return importlib.util.find_spec("peft") is not None


def measure(spec: ModelSpec, config: MeasureConfig) -> Measurement:
    """Measure one training step of ``spec`` (see ``frenzy.measure.step.measure``)."""
    if not torch_available():
        raise TorchMissingError(f"frenzy measure needs PyTorch, which is not installed: {INSTALL_HINT}")
    from frenzy.measure.step import measure as run

    return run(spec, config)


__all__ = ["INSTALL_HINT", "TorchMissingError", "measure", "peft_available", "torch_available"]
