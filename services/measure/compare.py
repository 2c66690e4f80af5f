"""MARP's prediction for the configuration ``frenzy measure`` ran, and the error against it.

Torch-free: the CLI imports this before it knows whether torch is installed. The recipe pins
every choice the measured step makes, so that MARP is asked about exactly that step: one GPU
(tp = pp = dp = 1, ZeRO 0, one micro-batch per step), eager PyTorch kernels, PyTorch
cross-entropy on fp32 logits, foreach optimizers, and the measured dropout and gradient lifetime.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import marp
from frenzy.measure.config import MeasureConfig, ParallelConfig

# frenzy measure's precision names -> MARP policies (``bf16`` is pure bf16, as in ``frenzy predict``'s
# single-layout mode).
PRECISIONS: dict[str, str] = {"fp32": "fp32", "bf16": "pure-bf16", "pure-bf16": "pure-bf16", "amp-bf16": "amp-bf16",
                               "fsdp-bf16": "fsdp-bf16"}  # fmt: skip
# The measured breakdown's "other" collects these MARP terms.
OTHER_TERMS: tuple[str, ...] = ("activations", "logits", "buffers", "transient")


def marp_inputs(config: MeasureConfig) -> tuple[marp.TrainingRecipe, marp.Layout]:
    """The ``TrainingRecipe`` and single-GPU ``Layout`` matching one measured step."""
    c = config
    recipe = marp.TrainingRecipe(
        seq_len=c.seq_len, global_batch=c.micro_batch, micro_batch=c.micro_batch,
        precision=c.precision, optimizer=c.optimizer,  # type: ignore[arg-type]
        optimizer_impl=c.optimizer_impl, flash_attention=c.attention == "flash",  # type: ignore[arg-type]
        dropout=c.dropout, kernels="eager", loss="torch", grad_buffer=c.grad_buffer,  # type: ignore[arg-type]
        allow_recompute=c.recompute != "none", kv_repeat=c.gqa == "repeat",
    )  # fmt: skip
    layout = marp.Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch=c.micro_batch, grad_accum=1,
                         recompute=c.recompute)  # type: ignore[arg-type]  # fmt: skip
    return recipe, layout


def marp_inputs_parallel(config: MeasureConfig, par: ParallelConfig) -> tuple[marp.TrainingRecipe, marp.Layout]:
    """The recipe and layout matching one step of the multi-GPU oracle: FSDP2 is ZeRO-3 over
    dp x cp (none when dp x cp = 1), tensor parallelism runs with sequence parallelism, the
    global batch is dp micro-batches, LoRA as the oracle's."""
    recipe, layout = marp_inputs(config)
    recipe = dataclasses.replace(recipe, global_batch=config.micro_batch * par.dp, finetune=par.finetune,
                                 lora_rank=par.lora_rank, lora_targets=par.lora_targets,
                                 lora_dropout=par.lora_dropout, fsdp_reshard=par.fsdp_reshard,
                                 lora_adapter_dtype=par.lora_adapter_dtype)  # fmt: skip
    layout = dataclasses.replace(layout, tp=par.tp, dp=par.dp, cp=par.cp, sp=par.sequence_parallel,
                                 zero_stage=3 if par.fsdp else 0)  # fmt: skip
    return recipe, layout


def predict_parallel(spec: marp.ModelSpec, config: MeasureConfig, par: ParallelConfig) -> marp.MemoryBreakdown:
    """MARP's prediction for one rank of the layout ``par`` (MARP does not tell ranks apart)."""
    recipe, layout = marp_inputs_parallel(config, par)
    return marp.predict_memory(spec, recipe, layout)


def report_parallel(measured: Any, predicted: marp.MemoryBreakdown) -> dict[str, Any]:
    """One JSON object for a ``frenzy.measure.parallel.LayoutMeasurement``: each measured rank beside
    MARP's prediction and its error."""
    peak = predicted.peak_allocated
    ranks = [{**r.to_dict(), "marp_peak_bytes": peak, "error_pct": error_pct(peak, r.peak_bytes)}
             for r in measured.ranks]  # fmt: skip
    return {
        "model": measured.model,
        "config": dataclasses.asdict(measured.config),
        "parallel": {**dataclasses.asdict(measured.parallel), "sequence_parallel": measured.parallel.sequence_parallel,
                     "world_size": measured.parallel.world_size},  # fmt: skip
        "ranks": ranks,
        "symmetric_to": {str(k): v for k, v in measured.symmetric_to.items()},
        "marp": {"peak_allocated_bytes": peak, "phase": predicted.phase, "breakdown": comparable(predicted),
                 "terms": predicted.to_dict()},  # fmt: skip
        "max_abs_error_pct": max(abs(r["error_pct"]) for r in ranks),
        "notes": list(measured.notes),
    }


def predict(spec: marp.ModelSpec, config: MeasureConfig) -> marp.MemoryBreakdown:
    """MARP's prediction for the step ``config`` describes."""
    recipe, layout = marp_inputs(config)
    return marp.predict_memory(spec, recipe, layout)


def comparable(breakdown: marp.MemoryBreakdown) -> dict[str, int]:
    """MARP's breakdown in the measured categories (parameters, gradients, optimizer states, other)."""
    return {
        "parameters": breakdown.parameters,
        "gradients": breakdown.gradients,
        "optimizer_states": breakdown.optimizer_states,
        "other": sum(getattr(breakdown, name) for name in OTHER_TERMS),
    }


def error_pct(predicted: int, measured: int) -> float:
    """Signed error of the prediction, in % of the measurement (negative: MARP under-predicts)."""
    return round(100.0 * (predicted - measured) / measured, 2) if measured else 0.0


def report(measured: dict[str, Any], predicted: marp.MemoryBreakdown) -> dict[str, Any]:
    """One JSON object: the measurement, MARP's prediction and the error of MARP's peak."""
    return {
        "model": measured["model"],
        "config": measured["config"],
        "measured": {"peak_allocated_bytes": measured["peak_bytes"], "phase": measured["phase"],
                     "breakdown": measured["breakdown"], "phase_peaks": measured["phase_peaks"],
                     "param_count": measured["param_count"], "seconds": measured["seconds"]},  # fmt: skip
        "marp": {"peak_allocated_bytes": predicted.peak_allocated, "phase": predicted.phase,
                 "breakdown": comparable(predicted), "terms": predicted.to_dict()},  # fmt: skip
        "error_pct": error_pct(predicted.peak_allocated, measured["peak_bytes"]),
        "notes": measured.get("notes", []),
    }


__all__ = [
    "OTHER_TERMS", "PRECISIONS", "comparable", "error_pct", "marp_inputs", "marp_inputs_parallel", "predict",
    "predict_parallel", "report", "report_parallel",
]  # fmt: skip
