"""MARP against published GPU memory measurements (bench/data/memory/measurements.csv).

For every row: build the model, recipe and layout the row describes, predict the quantity the
row measured (peak allocated, peak reserved or device memory in use), and report the signed
error. Beside MARP, two simple references on the same rows: DeepSpeed's published model-state
estimate (deepspeed.runtime.zero: estimate_zero2_model_states_mem_needs, 4P + 16P/N; and
estimate_zero3_model_states_mem_needs, 4 x largest layer + 18P/N, without offload) and the bare
"16 bytes per parameter" rule, both given the parameters one TP x PP rank holds.

Beside the memory table, the speed table: for every published training run in
bench/data/speed/throughput.csv, MARP's predicted tokens per second per GPU
(``estimate_step_time``) against the measured one, with the signed error.

Run from the repository root: ``.venv/bin/python bench/marp_accuracy.py`` (prints JSON; ``--table``
prints the two summaries and the speed table as text; ``--docs`` writes the speed table into
docs/marp.md between its ``speed-table`` markers; ``--write-guard`` writes every row's current
prediction beside its measurement into tests/unit/marp/guard/accuracy_expected.json, the committed
values the regression guard, tests/unit/marp/test_accuracy_guard.py, holds MARP to). The mapping from CSV columns to MARP's
inputs is below; it reads configuration only, never the measured value, and no row is
special-cased.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "libs"))

from marp import (  # noqa: E402
    Layout,
    ModelSpec,
    TrainingRecipe,
    estimate_step_time,
    get_gpu,
    model_from_hf_config,
    predict_memory,
)

CSV_PATH = ROOT / "bench" / "data" / "memory" / "measurements.csv"
SPEED_CSV = ROOT / "bench" / "data" / "speed" / "throughput.csv"


def _dropout(text: str) -> float:
    nums = [float(x) for x in re.findall(r"\d*\.\d+", text)]
    return max(nums) if nums else 0.0


def _gpu(text: str) -> str:
    t = text.lower()
    if "v100" in t:
        return "V100-16GB" if "16" in t else "V100-32GB"
    if "h100" in t:
        return "H100-80GB"
    return "A100-40GB" if "a100 40gb" in t else "A100-80GB"


def _precision(text: str) -> str:
    t = text.lower()
    if "megatron --fp16" in t:  # fp16 params, fp32 master weights and Adam states (Float16 optimizer)
        return "master-fp16"
    if "megatron --bf16" in t or "fp32 master" in t:
        return "master-bf16"
    if "fp32 sharded params" in t:
        return "fsdp-bf16"
    if "pure bf16" in t:
        return "pure-bf16"
    if "amp fp16" in t:
        return "amp-fp16"
    if "amp bf16" in t:
        return "amp-bf16"
    return "fp32"


def _main_grad_dtype(text: str) -> str:
    """The main-grad buffer's dtype a Megatron row's precision column gives: "half" where it says
    the buffer is fp16 (--fp16 without --accumulate-allreduce-grads-in-fp32), else fp32."""
    return "half" if "fp16 main-grad buffer" in text.lower() else "fp32"


def _optimizer_impl(text: str) -> str | None:
    t = text.lower()
    if "fused" in t:
        return "fused"
    if "foreach" in t:
        return "foreach"
    if "adamw_hf" in t:
        return "forloop"  # transformers' own AdamW: a Python loop over parameters
    return None


def _recompute(text: str) -> str:
    t = text.lower()
    if t.startswith("full"):
        return "full"
    if "sac" in t:
        return "op-sac"
    if t.startswith("selective"):
        return "selective"
    return "none"


def _loss(row: dict[str, str]) -> str:
    t = row["loss"].lower()
    if "cross_entropy_loss_fusion" in row["source_url"]:
        return "megatron-fused"  # the test's --cross-entropy-loss-fusion flag
    if "cross_entropy_loss_fusion true" in t:
        return "megatron-fused"  # the flag as a run's printed config gives it (Megatron-Bridge)
    if "chunked" in t:
        return "chunked"
    if "fused classifier" in t:
        return "inplace"
    if "megatron" in t:
        # Megatron's CE subtracted the max out of place until at least mid-2024 (sizes.
        # loss_bytes_per_logit, fused-copy); a run dated 2023 ran that version.
        return "fused-copy" if "2023" in row.get("framework", "") else "fused"
    return "torch"


def _quantity(text: str) -> str:
    t = text.lower()
    if "reserved" in t:
        return "reserved"
    if "pynvml" in t or "nvidia-smi" in t or "mib/gpu" in t:
        return "device"
    return "allocated"


def row_inputs(row: dict[str, str]) -> tuple[ModelSpec, TrainingRecipe, Layout, str, str, str]:
    """(model, recipe, layout, gpu, stage, quantity) for one CSV row."""
    encoder = "bert" in row["model"].lower()
    seq = int(row["seq_len"])
    model = ModelSpec(
        name=row["id"], family="bert" if encoder else "custom", n_layers=int(row["n_layers"]),
        hidden=int(row["hidden"]), heads=int(row["heads"]), kv_heads=int(row["kv_heads"]),
        ffn=int(row["ffn"]), mlp=row["mlp_act"], vocab=int(row["vocab"]),
        tied_embeddings=row["tied_embeddings"] == "True", pos_emb=row["pos_emb"],
        max_positions=512 if encoder else seq, norm="rmsnorm" if "rms" in row["norm"].lower() else "layernorm",
        bias=row["linear_bias"] == "True", dropout=_dropout(row["dropout"]),
        arch="encoder" if encoder else "decoder", head="classifier" if "2-class" in row["loss"] else "lm",
        num_labels=2, type_vocab=2 if encoder else 0,
    )  # fmt: skip
    dp, mb = int(row["dp"]), int(row["micro_batch"])
    gb = int(row["global_batch"]) if row["global_batch"] else dp * mb
    precision = _precision(row["precision"])
    framework = row["framework"].lower()
    # PyTorch < 2.0 (the 2022 HF Trainer) and llm.c keep gradients allocated between steps.
    grad_buffer = "persistent" if ("2022" in framework or "llm.c" in framework) else None
    # Fused pointwise kernels: torch.compile's, Megatron's (Transformer Engine) and llm.c's own
    # CUDA kernels; DeepSpeed's bf16 recipe (master weights too) runs the model's eager modules.
    fused = row["torch_compile"] == "yes" or "megatron" in framework or "llm.c" in framework
    # Optional columns (multi_gpu_public.csv): a LoRA / QLoRA fine-tune, its adapters and their
    # dropout (peft's lora_dropout), the adapters' dtype (fp32: peft's default), float8, and which FSDP2
    # blocks reshard after their forward (torchtune: all), and QLoRA's NF4 implementation.
    finetune = row.get("finetune") or "full"
    targets = tuple(row["lora_targets"].split(",")) if row.get("lora_targets") else ("q", "k", "v", "o")
    recipe = TrainingRecipe(
        seq_len=seq, global_batch=gb, micro_batch=mb, precision=precision,  # type: ignore[arg-type]
        optimizer="adamw", optimizer_impl=_optimizer_impl(row["optimizer"]),  # type: ignore[arg-type]
        flash_attention=not any(k in row["attention"].lower() for k in ("eager", "unfused")),
        loss=_loss(row), grad_buffer=grad_buffer,  # type: ignore[arg-type]
        kernels="fused" if fused else "eager", finetune=finetune,  # type: ignore[arg-type]
        lora_rank=int(row.get("lora_rank") or 16), lora_targets=targets, float8=bool(row.get("float8")),
        lora_dropout=float(row.get("lora_dropout") or 0.0),
        lora_adapter_dtype=row.get("lora_adapter_dtype") or "fp32",
        fsdp_reshard=row.get("fsdp_reshard") or "keep-last", qlora_backend=row.get("qlora_backend") or "bitsandbytes",
        main_grad_dtype=_main_grad_dtype(row["precision"]),
        # ZeRO-3 of a master-* row: DeepSpeed's where the sharding column names it, else Megatron-FSDP.
        zero3_backend="deepspeed" if "deepspeed" in row["sharding"].lower() else "megatron-fsdp",
    )  # fmt: skip
    shard = dp // 2 if "instances" in row["sharding"] or "instances" in row["source_url"] else None
    layout = Layout(
        tp=int(row["tp"]), pp=int(row["pp"]), dp=dp, zero_stage=int(row["zero_stage"]), micro_batch=mb,
        grad_accum=gb // (dp * mb), recompute=_recompute(row["act_ckpt"]),  # type: ignore[arg-type]
        sp=row["sequence_parallel"] == "yes", cp=int(row["cp"] or 1), vpp=int(row["vpp"] or 1),
        shard_degree=shard,
    )  # fmt: skip
    stage = "last" if row["measured_rank"].startswith("last rank") else "max"
    return model, recipe, layout, _gpu(row["gpu"]), stage, _quantity(row["measured_what"])


def deepspeed_rule(model: ModelSpec, layout: Layout) -> float:
    """DeepSpeed's model-state estimate for the parameters of one TP x PP rank, no offload."""
    per_rank = model.param_count() / (layout.tp * layout.pp)
    n = layout.dp if layout.zero_stage >= 1 else 1
    if layout.zero_stage >= 3:
        largest = max(model.layer_params(), model.vocab * model.hidden) / layout.tp
        return 4 * largest + 18 * per_rank / n
    return 4 * per_rank + 16 * per_rank / n


def bare16_rule(model: ModelSpec, layout: Layout) -> float:
    return 16.0 * model.param_count() / (layout.tp * layout.pp)


def _summary(errors: list[float], ids: list[str]) -> dict[str, Any]:
    worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
    return {
        "mape_pct": round(sum(abs(x) for x in errors) / len(errors), 2),
        "worst_row": ids[worst], "worst_error_pct": round(errors[worst], 2),
        "under_predicted_share": round(sum(1 for x in errors if x < 0) / len(errors), 3),
        "under_by_more_than_10pct": [ids[i] for i, x in enumerate(errors) if x < -10.0],
    }  # fmt: skip


def run(path: Path = CSV_PATH) -> dict[str, Any]:
    rows_out: list[dict[str, Any]] = []
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        model, recipe, layout, gpu, stage, quantity = row_inputs(row)
        mem = predict_memory(model, recipe, layout, gpu, stage=stage)
        predicted = {"allocated": mem.peak_allocated, "reserved": mem.reserved, "device": mem.device}[quantity]
        measured = int(row["measured_bytes"])
        ds, b16 = deepspeed_rule(model, layout), bare16_rule(model, layout)
        rows_out.append({
            "id": row["id"], "confidence": row["confidence"], "quantity": quantity, "stage": stage,
            "measured_bytes": measured, "predicted_bytes": predicted,
            "error_pct": round(100.0 * (predicted - measured) / measured, 2), "phase": mem.phase,
            "params_marp": model.param_count(), "params_csv": int(row["n_params_approx"]),
            "deepspeed_error_pct": round(100.0 * (ds - measured) / measured, 2),
            "bare16_error_pct": round(100.0 * (b16 - measured) / measured, 2),
            "breakdown_gib": {k: round(v / 2**30, 3) for k, v in mem.to_dict().items() if isinstance(v, int)},
        })  # fmt: skip
    ids = [r["id"] for r in rows_out]
    pytorch = [i for i, r in enumerate(rows_out) if not r["id"].startswith("LC-")]
    out = {
        "rows": rows_out,
        "marp": _summary([r["error_pct"] for r in rows_out], ids),
        "deepspeed_rule": _summary([r["deepspeed_error_pct"] for r in rows_out], ids),
        "bare_16_bytes_per_param": _summary([r["bare16_error_pct"] for r in rows_out], ids),
        "marp_pytorch_rows_only": _summary([rows_out[i]["error_pct"] for i in pytorch], [ids[i] for i in pytorch]),
    }
    return out


# ---- multi-GPU ---------------------------------------------------------------------------------

MULTI_GPU_CSV = ROOT / "bench" / "data" / "memory" / "multi_gpu_oracle.csv"


def multi_gpu_inputs(row: dict[str, str]) -> tuple[ModelSpec, TrainingRecipe, Layout]:
    """The recipe and layout of one multi-GPU row, as ``frenzy.measure.compare.marp_inputs_parallel``
    builds them for the oracle: FSDP2 is ZeRO-3 over dp x cp, TP runs with sequence parallelism."""
    model = model_from_hf_config({
        "arch": "decoder", "head": "lm", "n_layers": int(row["n_layers"]), "hidden": int(row["hidden"]),
        "heads": int(row["heads"]), "kv_heads": int(row["kv_heads"]), "ffn": int(row["ffn"]), "mlp": "swiglu",
        "vocab": int(row["vocab"]), "tied_embeddings": False, "pos_emb": "rope", "max_positions": 4096,
        "norm": "rmsnorm", "bias": False, "name": row["id"],
    })  # fmt: skip
    dp, tp, cp, mb = (int(row[k]) for k in ("dp", "tp", "cp", "micro_batch"))
    lora = row["finetune"] == "lora"
    recipe = TrainingRecipe(
        seq_len=int(row["seq_len"]), global_batch=mb * dp, micro_batch=mb, precision=row["precision"],  # type: ignore[arg-type]
        optimizer="adamw", optimizer_impl="foreach", flash_attention=row["attention"] == "flash", dropout=0.0,
        kernels="eager", loss="torch", grad_buffer="transient", finetune=row["finetune"],  # type: ignore[arg-type]
        lora_rank=int(row["lora_rank"]) if lora else 16,
        lora_targets=tuple(row["lora_targets"].split(",")) if lora else ("q", "k", "v", "o"),
        lora_dropout=float(row.get("lora_dropout") or 0.0), fsdp_reshard=row.get("fsdp_reshard") or "keep-last",
    )  # fmt: skip
    layout = Layout(tp=tp, pp=int(row["pp"]), dp=dp, cp=cp, zero_stage=int(row["zero_stage"]), micro_batch=mb,
                    grad_accum=1, recompute=row["recompute"], sp=tp > 1)  # type: ignore[arg-type]  # fmt: skip
    return model, recipe, layout


def run_multi_gpu(path: Path = MULTI_GPU_CSV) -> dict[str, Any]:
    """MARP's per-GPU peak allocated bytes against the multi-GPU rows (one rank each)."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    out: list[dict[str, Any]] = []
    for row in rows:
        model, recipe, layout = multi_gpu_inputs(row)
        mem = predict_memory(model, recipe, layout)
        measured = int(row["measured_bytes"])
        label = (f"vocab {row['vocab']} dp{layout.dp} x tp{layout.tp} x cp{layout.cp} {row['precision']}"
                 + (f" L{model.n_layers} rc {layout.recompute}" if layout.recompute != "none" else "")
                 + (f" LoRA r{recipe.lora_rank}" if recipe.finetune == "lora" else "")
                 + (" all" if len(recipe.lora_targets) == 7 and recipe.finetune == "lora" else "")
                 + (f" drop {recipe.lora_dropout}" if recipe.lora_dropout else "")
                 + (" reshard all" if recipe.fsdp_reshard == "all" else ""))  # fmt: skip
        out.append({
            "id": row["id"], "layout": label, "measured_bytes": measured, "predicted_bytes": mem.peak_allocated,
            "error_pct": round(100.0 * (mem.peak_allocated - measured) / measured, 2), "phase": mem.phase,
            "measured_phase": row["phase"],
        })  # fmt: skip
    return {"rows": out, "marp": _summary([r["error_pct"] for r in out], [r["id"] for r in out])}


def multi_gpu_table(multi: dict[str, Any]) -> str:
    lines = [f"{'row':6} {'layout':54} {'measured MiB':>12} {'MARP MiB':>9} {'error':>8}  phase (measured / MARP)"]
    for r in multi["rows"]:
        lines.append(f"{r['id']:6} {r['layout']:54} {r['measured_bytes'] / 2**20:12.2f} "
                     f"{r['predicted_bytes'] / 2**20:9.2f} {r['error_pct']:+7.2f}%  {r['measured_phase']} / {r['phase']}")
    s = multi["marp"]
    lines.append(f"{len(multi['rows'])} rows: mean |error| {s['mape_pct']:.2f} %, worst {s['worst_row']} "
                 f"{s['worst_error_pct']:+.2f} %, under by > 10 %: {', '.join(s['under_by_more_than_10pct']) or 'none'}")
    return "\n".join(lines)


# ---- public multi-GPU measurements -------------------------------------------------------------

PUBLIC_MULTI_GPU_CSV = ROOT / "bench" / "data" / "memory" / "multi_gpu_public.csv"


def run_public_multi_gpu(path: Path = PUBLIC_MULTI_GPU_CSV) -> dict[str, Any]:
    """MARP against published multi-GPU peaks (bench/data/memory/MULTI_GPU.md): the rows have
    measurements.csv's columns (plus finetune, lora_rank, lora_targets), so ``run`` maps and
    predicts them exactly as it does the single-GPU set."""
    out = run(path)
    with open(path, newline="", encoding="utf-8") as fh:
        layouts = {row["id"]: row for row in csv.DictReader(fh)}
    for r in out["rows"]:
        row = layouts[r["id"]]
        _, recipe, layout, gpu, stage, _ = row_inputs(row)
        ft = {"lora": f" LoRA r{recipe.lora_rank}", "qlora": f" QLoRA r{recipe.lora_rank}"}.get(recipe.finetune, "")
        ft += " float8" if recipe.float8 else ""
        # tp / pp / cp only where the row uses them, so the 1-D data-parallel rows keep their labels
        dims = (("tp", layout.tp), ("pp", layout.pp), ("cp", layout.cp))
        grid = "".join(f" {k}{v}" for k, v in dims if v > 1)
        r["label"] = (f"{row['model'].split(' (')[0]}{ft} {layout.num_gpus}x {gpu} dp{layout.dp}{grid} "
                      f"z{layout.zero_stage} mb{layout.micro_batch} s{recipe.seq_len}"
                      f"{' last stage' if stage == 'last' else ''}")  # fmt: skip
    return out


def public_multi_gpu_table(public: dict[str, Any]) -> str:
    lines = [f"{'row':7} {'job':64} {'quantity':9} {'conf.':6} {'measured GiB':>12} {'MARP GiB':>9} {'error':>8}  phase"]
    for r in public["rows"]:
        lines.append(f"{r['id']:7} {r['label']:64} {r['quantity']:9} {r['confidence']:6} "
                     f"{r['measured_bytes'] / 2**30:12.2f} {r['predicted_bytes'] / 2**30:9.2f} {r['error_pct']:+7.2f}%  "
                     f"{r['phase']}")  # fmt: skip
    s = public["marp"]
    lines.append(f"{len(public['rows'])} rows: mean |error| {s['mape_pct']:.2f} %, worst {s['worst_row']} "
                 f"{s['worst_error_pct']:+.2f} %, under by > 10 %: {', '.join(s['under_by_more_than_10pct']) or 'none'}")
    return "\n".join(lines)


# ---- speed -------------------------------------------------------------------------------------


def measured_tokens_per_gpu(row: dict[str, str]) -> float:
    """The row's measurement as tokens/s/GPU (bench/data/speed/README.md gives the formulas)."""
    if row["measured_tokens_per_s_per_gpu"]:
        return float(row["measured_tokens_per_s_per_gpu"])
    n_l, h, s, v = int(row["n_layers"]), int(row["hidden"]), int(row["seq_len"]), int(row["vocab"])
    value = float(row["measured_value"])
    metric = row["measured_metric"].lower()
    if "mfu" in metric:  # Korthikanti et al. 2022: model FLOPs, no recompute, against 312 TFLOP/s
        per_token = 72.0 * n_l * h * h * (1 + s / (6 * h) + v / (12 * n_l * h))
        return value * 312e12 / per_token
    # Narayanan et al. 2021 eq. 3 (recompute included), value in TFLOP/s per GPU
    per_token = 96.0 * n_l * h * h * (1 + s / (6 * h) + v / (16 * n_l * h))
    return value * 1e12 / per_token


def speed_inputs(row: dict[str, str]) -> tuple[ModelSpec, TrainingRecipe, Layout]:
    seq = int(row["seq_len"])
    model = ModelSpec(
        name=row["id"], family="custom", n_layers=int(row["n_layers"]), hidden=int(row["hidden"]),
        heads=int(row["heads"]), kv_heads=int(row["kv_heads"]), ffn=int(row["ffn"]), mlp=row["mlp_act"],
        vocab=int(row["vocab"]), tied_embeddings=row["pos_emb"] == "learned", pos_emb=row["pos_emb"],
        max_positions=seq, norm="rmsnorm" if row["mlp_act"] == "swiglu" else "layernorm", bias=False,
        dropout=float(row["dropout"]),
    )  # fmt: skip
    tp, pp, dp, cp = (int(row[k]) for k in ("tp", "pp", "dp", "cp"))
    mb, gb = int(row["micro_batch"]), int(row["global_batch"])
    recipe = TrainingRecipe(seq_len=seq, global_batch=gb, micro_batch=mb,
                            precision=row["precision"],  # type: ignore[arg-type]
                            flash_attention=row["flash_attention"] == "yes")  # fmt: skip
    layout = Layout(
        tp=tp, pp=pp, dp=dp, zero_stage=int(row["zero_stage"]), micro_batch=mb, grad_accum=gb // (dp * mb),
        recompute=row["recompute"], sp=row["sp"] == "yes", cp=cp, vpp=int(row["vpp"]),  # type: ignore[arg-type]
    )  # fmt: skip
    return model, recipe, layout


def run_speed(path: Path = SPEED_CSV) -> dict[str, Any]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    out: list[dict[str, Any]] = []
    for row in rows:
        model, recipe, layout = speed_inputs(row)
        gbps = float(row["inter_node_gbps"]) if row["inter_node_gbps"] else None
        step = estimate_step_time(model, recipe, layout, get_gpu(row["gpu"]), int(row["gpus_per_node"]),
                                  inter_node_gbps=gbps, fp8=row["fp8"] == "yes")  # fmt: skip
        predicted = recipe.tokens_per_step / step / layout.num_gpus
        measured = measured_tokens_per_gpu(row)
        out.append({
            "id": row["id"], "gpu": row["gpu"], "num_gpus": layout.num_gpus,
            "nodes": -(-layout.num_gpus // int(row["gpus_per_node"])),
            "measured_tokens_per_s_per_gpu": round(measured, 1), "predicted_tokens_per_s_per_gpu": round(predicted, 1),
            "error_pct": round(100.0 * (predicted - measured) / measured, 2),
        })  # fmt: skip
    errs = [r["error_pct"] for r in out]

    def summary(sel: list[float]) -> dict[str, Any]:
        return {"rows": len(sel), "mean_abs_error_pct": round(sum(abs(x) for x in sel) / len(sel), 2),
                "max_abs_error_pct": round(max(abs(x) for x in sel), 2),
                "mean_signed_error_pct": round(sum(sel) / len(sel), 2)}  # fmt: skip

    return {
        "rows": out, "all": summary(errs),
        "single_node": summary([r["error_pct"] for r in out if r["nodes"] == 1]),
        "multi_node": summary([r["error_pct"] for r in out if r["nodes"] > 1]),
        "gpu_types": sorted({r["gpu"] for r in out}),
    }


def speed_table(speed: dict[str, Any]) -> str:
    lines = [f"{'run':24} {'gpu':10} {'gpus':>5} {'measured':>10} {'predicted':>10} {'error':>8}"]
    for r in speed["rows"]:
        lines.append(f"{r['id']:24} {r['gpu']:10} {r['num_gpus']:5d} {r['measured_tokens_per_s_per_gpu']:10.0f} "
                     f"{r['predicted_tokens_per_s_per_gpu']:10.0f} {r['error_pct']:+7.1f}%")  # fmt: skip
    for key in ("all", "single_node", "multi_node"):
        s = speed[key]
        lines.append(f"{key}: {s['rows']} runs, mean |error| {s['mean_abs_error_pct']:.1f} %, "
                     f"max |error| {s['max_abs_error_pct']:.1f} %, mean signed {s['mean_signed_error_pct']:+.1f} %")
    return "\n".join(lines)


# ---- the regression guard ----------------------------------------------------------------------

GUARD_PATH = ROOT / "tests" / "unit" / "marp" / "guard" / "accuracy_expected.json"
# How far a row's signed error may move from its committed value before the guard fails, in points
# of the measurement (percent): "a few percent" (issue 36). Memory rows are exact enough for 2;
# the speed rows' measurements are throughputs converted from MFU or TFLOP/s, and step time is the
# coarser model: 3.
GUARD_TOLERANCE_PP: dict[str, float] = {"memory": 2.0, "multi_gpu_oracle": 2.0, "multi_gpu_public": 2.0, "speed": 3.0}


def guard_rows() -> list[dict[str, Any]]:
    """Every validated row of the four tables: (table, id, measured, predicted, signed error %).

    Memory rows carry bytes (allocated, reserved or device, as the row measured), speed rows
    tokens/s/GPU. The guard compares a fresh run of this list with the committed one."""
    out: list[dict[str, Any]] = []
    for table, result in (("memory", run()), ("multi_gpu_oracle", run_multi_gpu()),
                          ("multi_gpu_public", run_public_multi_gpu())):  # fmt: skip
        for r in result["rows"]:
            out.append({"table": table, "id": r["id"], "measured": r["measured_bytes"],
                        "predicted": int(r["predicted_bytes"]), "error_pct": r["error_pct"]})  # fmt: skip
    for r in run_speed()["rows"]:
        out.append({"table": "speed", "id": r["id"], "measured": r["measured_tokens_per_s_per_gpu"],
                    "predicted": r["predicted_tokens_per_s_per_gpu"], "error_pct": r["error_pct"]})  # fmt: skip
    for r in out:
        r["tolerance_pp"] = GUARD_TOLERANCE_PP[r["table"]]
    return out


def write_guard(path: Path = GUARD_PATH) -> None:
    """Write ``guard_rows()`` as the committed expected values (review the diff: every row that
    moved is a row whose prediction the change moved)."""
    body = {"_comment": "Written by `.venv/bin/python bench/marp_accuracy.py --write-guard`: every validated "
                        "row's measurement and MARP's prediction at the commit that wrote it; "
                        "tests/unit/marp/test_accuracy_guard.py fails when a row's signed error moves by more "
                        "than its tolerance_pp (points of the measurement).",
            "rows": guard_rows()}  # fmt: skip
    # One row a line, so a change's diff lists exactly the rows it moved.
    rows = ",\n  ".join(json.dumps(r) for r in body["rows"])
    path.write_text(f'{{"_comment": {json.dumps(body["_comment"])},\n "rows": [\n  {rows}\n ]\n}}\n', encoding="utf-8")


def write_docs(table: str, path: Path = ROOT / "docs" / "marp.md") -> None:
    """Put ``table`` between docs/marp.md's ``<!-- speed-table begin/end -->`` markers (the doc's
    table is this script's output, never typed by hand)."""
    text = path.read_text(encoding="utf-8")
    begin, end = "<!-- speed-table begin -->", "<!-- speed-table end -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no {begin} ... {end} markers")
    body = f"{begin}\n_Printed by `.venv/bin/python bench/marp_accuracy.py --table`._\n\n```\n{table}\n```\n{end}"
    path.write_text(pattern.sub(lambda _: body, text), encoding="utf-8")


if __name__ == "__main__":
    memory = run()
    speed = run_speed()
    if "--write-guard" in sys.argv[1:]:
        write_guard()
        print(f"wrote {GUARD_PATH.relative_to(ROOT)}")
    elif "--docs" in sys.argv[1:]:
        write_docs(speed_table(speed))
    elif "--table" in sys.argv[1:]:
        print("memory (MARP):", json.dumps(memory["marp"]))
        print("memory, multi-GPU: per-rank peak allocated, MARP vs the fake-tensor oracle "
              "(bench/data/memory/multi_gpu_oracle.csv)")
        print(multi_gpu_table(run_multi_gpu()))
        print("memory, public multi-GPU: published per-GPU peaks of multi-GPU runs, MARP's prediction of the "
              "quantity each measured (bench/data/memory/multi_gpu_public.csv)")
        print(public_multi_gpu_table(run_public_multi_gpu()))
        print("speed: tokens/s/GPU, predicted vs measured (bench/data/speed/throughput.csv)")
        print(speed_table(speed))
    else:
        memory["multi_gpu"] = run_multi_gpu()
        memory["multi_gpu_public"] = run_public_multi_gpu()
        memory["speed"] = speed
        print(json.dumps(memory, indent=2))
