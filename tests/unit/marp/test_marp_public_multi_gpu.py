"""The public multi-GPU memory set (bench/data/memory/multi_gpu_public.csv, issue 16).

Every row is a published per-GPU peak of a multi-GPU training run with the configuration its
source gives; ``bench/marp_accuracy.py`` maps it to MARP's inputs with the same function as the
single-GPU set. These tests hold the set to what MULTI_GPU.md promises (multi-GPU, cited,
licensed, one MARP input per row that reproduces the model's size) and check that the third
table of ``--table`` prints every row with its summary.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import marp_accuracy  # noqa: E402

CSV = marp_accuracy.PUBLIC_MULTI_GPU_CSV


def _rows() -> list[dict[str, str]]:
    with open(CSV, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_every_row_is_a_cited_multi_gpu_run() -> None:
    rows = _rows()
    assert len(rows) >= 8
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source_url"].startswith("https://"), r["id"]
        assert r["source_detail"] and r["licence"] and r["measured_what"], r["id"]
        n = int(r["n_gpus"])
        assert n > 1, r["id"]
        assert int(r["dp"]) * int(r["tp"]) * int(r["pp"]) * int(r["cp"] or 1) == n, r["id"]
        # measured_gib is the measured bytes in GiB, as the source gave them
        assert int(r["measured_bytes"]) / 2**30 == pytest.approx(float(r["measured_gib"]), abs=1e-3), r["id"]


def test_rows_map_to_marp_inputs_of_the_right_size() -> None:
    for r in _rows():
        model, recipe, layout, gpu, stage, quantity = marp_accuracy.row_inputs(r)
        assert layout.num_gpus == int(r["n_gpus"]), r["id"]
        assert recipe.finetune == (r["finetune"] or "full"), r["id"]
        assert quantity in ("allocated", "reserved", "device"), r["id"]
        # the model MARP builds from the row's hyper-parameters has the row's parameter count
        assert model.param_count() == pytest.approx(int(r["n_params_approx"]), rel=0.01), r["id"]
        # no source forbidden for the independent check (issue 16) is in the set
        for kept_aside in ("torchtitan/blob/main/benchmarks", "functional_tests", "fsdp_qlora"):
            assert kept_aside not in r["source_url"], r["id"]


def test_the_table_prints_every_row_and_its_summary() -> None:
    public = marp_accuracy.run_public_multi_gpu()
    ids = [r["id"] for r in _rows()]
    assert [r["id"] for r in public["rows"]] == ids
    assert all(r["predicted_bytes"] > 0 for r in public["rows"])
    table = marp_accuracy.public_multi_gpu_table(public)
    lines = table.splitlines()
    assert len(lines) == len(ids) + 2
    assert lines[-1].startswith(f"{len(ids)} rows: mean |error| {public['marp']['mape_pct']:.2f} %")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "marp_accuracy.py"), "--table"],
                         capture_output=True, text=True, check=True, timeout=120).stdout  # fmt: skip
    assert "memory, public multi-GPU" in out and table in out


def test_megatron_tp_pp_rows_map_to_their_grid_and_stage() -> None:
    # The LGA- rows (Megatron-LM GPT-2 345M, llm-action's logs): tp / pp / sequence parallel from the
    # run's printed arguments, the last pipeline stage where the row measured it, fp16 master weights.
    rows = {r["id"]: r for r in _rows() if r["id"].startswith("LGA-")}
    assert len(rows) == 5
    grids = set()
    for rid, r in rows.items():
        _, recipe, layout, _, stage, quantity = marp_accuracy.row_inputs(r)
        grids.add((layout.tp, layout.pp))
        assert (layout.tp, layout.pp, layout.dp) == (int(r["tp"]), int(r["pp"]), 1), rid
        assert layout.sp == (layout.tp > 1), rid
        assert layout.grad_accum == 4, rid  # 4 micro-batches per step in every run
        assert recipe.precision == "master-fp16" and not recipe.flash_attention, rid
        # --fp16 without --accumulate-allreduce-grads-in-fp32: the main-grad buffer is fp16; the
        # July-2023 CE subtracts the max out of place
        assert recipe.main_grad_dtype == "half" and recipe.loss == "fused-copy", rid
        assert stage == ("last" if r["measured_rank"].startswith("last rank") else "max"), rid
        assert quantity == "allocated", rid
    assert grids == {(2, 2), (4, 1), (1, 4)}
    labels = {r["id"]: r["label"] for r in marp_accuracy.run_public_multi_gpu()["rows"]}
    assert " tp2 pp2 " in labels["LGA-01"] and labels["LGA-02"].endswith(" last stage")
    assert " tp4 " in labels["LGA-03"] and " pp4 " in labels["LGA-04"]
    assert " tp" not in labels["TAO-01"] and " pp" not in labels["TAO-01"]


def test_lsl01_is_the_a100_run_its_log_names() -> None:
    # The run's torchrun failure report names node gpu32 (an A100 node of KISTI Neuron), where
    # Transformer Engine runs flash / cuDNN fused attention; fp16 main grads; mcore's CE.
    row = next(r for r in _rows() if r["id"] == "LSL-01")
    assert "gpu32" in row["gpu"] and "v100" not in row["gpu"].lower()
    _, recipe, layout, gpu, _, _ = marp_accuracy.row_inputs(row)
    assert gpu.startswith("A100") and recipe.flash_attention
    assert (recipe.main_grad_dtype, recipe.loss, layout.tp, layout.sp) == ("half", "fused", 4, True)


def test_main_grad_dtype_mapping_reads_the_buffer() -> None:
    grads = marp_accuracy._main_grad_dtype
    assert grads("Megatron --fp16: fp16 params, fp16 main-grad buffer (grad_reduce_in_fp32 False)") == "half"
    assert grads("bf16 params + fp32 main grads + fp32 master (Megatron --bf16)") == "fp32"
    mbr = next(r for r in _rows() if r["id"] == "MBR-01")
    assert marp_accuracy.row_inputs(mbr)[1].main_grad_dtype == "fp32"


def test_precision_mapping_tells_megatron_fp16_from_bf16() -> None:
    policy = marp_accuracy._precision
    assert policy("Megatron --fp16: fp16 params, fp32 master weights") == "master-fp16"
    assert policy("bf16 params + fp32 main grads + fp32 master (Megatron --bf16)") == "master-bf16"
    assert policy("bf16 params/activations, fp32 AdamW m,v (+ fp32 master copy)") == "master-bf16"
    assert policy("amp fp16 (Trainer fp16=True)") == "amp-fp16"


def test_loss_mapping_reads_the_cross_entropy_fusion_flag() -> None:
    def loss(text: str) -> str:
        return marp_accuracy._loss({"loss": text, "source_url": "https://example.org/run"})

    assert loss("vocab-parallel CE, cross_entropy_loss_fusion true (native)") == "megatron-fused"
    assert loss("Megatron vocab-parallel CE (fp16_lm_cross_entropy False)") == "fused"
    mbr = next(r for r in _rows() if r["id"] == "MBR-01")
    _, recipe, layout, _, _, _ = marp_accuracy.row_inputs(mbr)
    assert recipe.loss == "megatron-fused" and recipe.precision == "master-bf16"
    assert (layout.dp, layout.zero_stage, layout.grad_accum) == (8, 1, 64)


def test_accuracy_does_not_regress() -> None:
    # Today: mean |error| 5.97 % over 18 rows, worst TTN-02 +26.05 % (405B QLoRA); the Megatron rows
    # LGA-01..05 and LSL-01 within -2.7 to -1.3 % since Megatron --fp16's half main-grad buffer and
    # the July-2023 CE's out-of-place max subtraction are charged and LSL-01 is mapped to the A100
    # node its log names (it was +78 % as a V100 with unfused attention). No row under by more than
    # 10 %. A row MARP misses stays in the set (MULTI_GPU.md); this keeps it from getting worse unnoticed.
    s = marp_accuracy.run_public_multi_gpu()["marp"]
    assert s["mape_pct"] <= 6.2
    assert abs(s["worst_error_pct"]) <= 27.0
    assert s["under_by_more_than_10pct"] == []
