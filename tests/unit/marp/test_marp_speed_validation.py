"""MARP's step time against the published training runs of bench/data/speed (issue 19's bar).

The bench script maps every CSV row to a model, recipe and layout and predicts tokens per second
per GPU; these tests hold the model to the accuracy the issue asks for and to properties of the
set (GPU types, single- and multi-node), so a change to a rate or an overlap that breaks the
calibration fails here rather than in a user's completion-time estimate.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import marp_accuracy  # noqa: E402


@pytest.fixture(scope="module")
def speed() -> dict:
    return marp_accuracy.run_speed()


def test_validation_set_covers_gpu_types_and_scales(speed: dict) -> None:
    rows = speed["rows"]
    assert len(rows) >= 25
    assert len(speed["gpu_types"]) >= 3
    assert speed["single_node"]["rows"] >= 5 and speed["multi_node"]["rows"] >= 5


@pytest.mark.parametrize("part", ["all", "single_node", "multi_node"])
def test_mean_and_worst_error_within_the_issue_bar(speed: dict, part: str) -> None:
    assert speed[part]["mean_abs_error_pct"] <= 15.0
    assert speed[part]["max_abs_error_pct"] <= 30.0


def test_no_systematic_bias(speed: dict) -> None:
    # The old model predicted 0.21x-0.64x of measured multi-node speed; a calibrated one is unbiased.
    assert abs(speed["all"]["mean_signed_error_pct"]) <= 10.0
    assert abs(speed["multi_node"]["mean_signed_error_pct"]) <= 10.0


def test_measured_conversion_matches_published_figures() -> None:
    # Narayanan et al. 2021 eq. 3: 145.6B at 148 TFLOP/s per GPU is ~124 tokens/s per GPU.
    row = {"measured_tokens_per_s_per_gpu": "", "n_layers": "80", "hidden": "12288", "seq_len": "2048",
           "vocab": "51200", "measured_value": "148", "measured_metric": "achieved TFLOP/s per GPU (eq. 3)"}
    assert marp_accuracy.measured_tokens_per_gpu(row) == pytest.approx(124.0, rel=0.01)
    # Korthikanti et al. 2022: MFU against 312 TFLOP/s with 72 l h^2 (1 + s/6h + V/12lh) per token.
    row |= {"n_layers": "96", "measured_value": "0.514", "measured_metric": "model FLOPs utilization (MFU)"}
    per_token = 72 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (12 * 96 * 12288))
    assert marp_accuracy.measured_tokens_per_gpu(row) == pytest.approx(0.514 * 312e12 / per_token)


def test_docs_speed_table_is_the_scripts_output(speed: dict) -> None:
    # docs/marp.md shows the table `bench/marp_accuracy.py --docs` writes: a change to the model
    # that moves a number must regenerate it (the doc never drifts from the code).
    text = (ROOT / "docs" / "marp.md").read_text(encoding="utf-8")
    block = text.split("<!-- speed-table begin -->", 1)[1].split("<!-- speed-table end -->", 1)[0]
    assert marp_accuracy.speed_table(speed) in block, "run: .venv/bin/python bench/marp_accuracy.py --docs"
