"""`frenzy predict` and mixed plans (issue 33): one job over several GPU types.

In-process through typer's CliRunner: the fragmented example cluster ranks a mixed plan first for a
model no single pool holds; every --json plan carries gpus_by_type; an explicit layout given stage
by stage (--stage GPUS:LAYERS[:tpK], --local-micro-batch) reports the step time and every stage's
peak; malformed stages exit 2 naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

RUN = CliRunner()
ROOT = Path(__file__).resolve().parents[3]
FRAGMENTED = str(ROOT / "examples" / "clusters" / "fragmented.yaml")
JOB = ["predict", "--model", "llama-2-13b", "--seq-len", "4096", "--global-batch", "64"]
GPT2 = ["predict", "--model", "gpt2-medium", "--seq-len", "1024", "--global-batch", "32", "--micro-batch", "1",
        "--precision", "fp16"]  # fmt: skip


def _run(*args: str) -> tuple[int, str]:
    res = RUN.invoke(app, list(args))
    return res.exit_code, res.output


def test_fragmented_cluster_ranks_a_mixed_plan_first() -> None:
    code, out = _run(*JOB, "--cluster", FRAGMENTED, "--json")
    assert code == 0, out
    plans = json.loads(out)
    best = plans[0]
    assert len(best["gpus_by_type"]) == 2 and "mixed" in best, best
    assert best["num_gpus"] == sum(best["gpus_by_type"].values())
    stages = best["mixed"]["stages"]
    assert sum(st["layers"] for st in stages) == 40 and stages[0]["embeddings"] and stages[-1]["head"]
    for st in stages:
        for t in st["types"]:
            assert t["peak_bytes"] <= t["gpu_memory_bytes"] * 0.95
    assert all("gpus_by_type" in p for p in plans)
    # No single pool holds the job: without mixed plans nothing fits.
    code, out = _run(*JOB, "--cluster", FRAGMENTED, "--no-mixed")
    assert code == 3 and "no GPU type can hold this job" in out


def test_the_table_shows_a_mixed_plan_as_one_row_with_a_sub_table() -> None:
    code, out = _run(*JOB, "--cluster", FRAGMENTED, "--top", "3")
    assert code == 0, out
    assert "x A100-80GB + " in out or "+ 2x A100-80GB" in out
    assert "step share" in out and "peak GiB" in out


def test_single_type_plans_carry_gpus_by_type_too() -> None:
    for extra in ([], ["--precision", "amp-bf16"]):  # the predictor's path and MARP's own
        code, out = _run("predict", "--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8",
                         "--gpu-type", "A100-80GB", "--json", *extra)  # fmt: skip
        assert code == 0, out
        for p in json.loads(out):
            assert p["gpus_by_type"] == {p["gpu_type"]: p["num_gpus"]}


def test_explicit_stages_report_step_time_and_every_stage_peak() -> None:
    code, out = _run(*GPT2, "--stage", "4xV100-16GB:7", "--stage", "4xV100-16GB:7:tp1", "--stage", "4xV100-16GB:6",
                     "--stage", "4xT4:4", "--json")  # fmt: skip
    assert code == 0, out
    d = json.loads(out)
    assert d["fits"] and d["step_time_s"] > 0 and d["gpus_by_type"] == {"V100-16GB": 12, "T4": 4}
    assert [st["layers"] for st in d["stages"]] == [7, 7, 6, 4]
    assert all(st["peak_bytes"] > 0 for st in d["stages"])
    assert [link["kind"] for link in d["links"]] == ["intra", "inter", "inter"]  # 8 GPUs a node by default


def test_one_stage_over_two_types_with_local_micro_batches() -> None:
    code, out = _run(*GPT2, "--global-batch", "64", "--stage", "12xV100-16GB+4xT4:24:tp2", "--local-micro-batch",
                     "V100-16GB=2", "--zero", "1", "--json")  # fmt: skip
    assert code == 0, out
    d = json.loads(out)
    shares = {t["gpu_type"]: t for t in d["stages"][0]["types"]}
    assert shares["V100-16GB"]["micro_batch"] == 2 and shares["T4"]["micro_batch"] == 1
    assert sum(t["gpus"] // 2 * t["micro_batch"] * t["grad_accum"] for t in shares.values()) == 64


def test_a_stage_that_does_not_fit_exits_3_naming_it(tmp_path: Path) -> None:
    code, out = _run(*JOB, "--micro-batch", "1", "--cluster", FRAGMENTED, "--stage", "2xA100-80GB:36:tp2",
                     "--stage", "8xL4:4:tp4", "--local-micro-batch", "A100-80GB=2", "--json")  # fmt: skip
    assert code == 3
    assert "stage 0 on A100-80GB" in out and '"fits": false' in out


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--stage", "4xV100-16GB"], "--stage"),
        (["--stage", "4V100-16GB:24"], "--stage"),
        (["--stage", "4xV100-16GB:x"], "--stage"),
        (["--stage", "4xV100-16GB:24:t2"], "--stage"),
        (["--stage", "0xT4:24"], "--stage"),
        (["--stage", "4xV100-16GB:20"], "--stage"),  # 20 of 24 layers
        (["--stage", "4xNoSuchGPU:24"], "--stage"),
        (["--stage", "4xV100-16GB:12", "--stage", "2xT4:12"], "--stage"),  # 4 vs 2 samples a micro-batch
        (["--stage", "4xV100-16GB:24", "--stage", "first"], "--stage"),
        (["--stage", "4xV100-16GB:24", "--local-micro-batch", "T4"], "--local-micro-batch"),
        (["--stage", "4xV100-16GB:24", "--local-micro-batch", "T4=2"], "--local-micro-batch"),
        (["--stage", "4xV100-16GB:24", "--dp", "2"], "--dp"),
        (["--local-micro-batch", "T4=2", "--dp", "1", "--gpu", "T4"], "--local-micro-batch"),
    ],
)
def test_malformed_mixed_layouts_exit_2_naming_the_flag(args: list[str], flag: str) -> None:
    code, out = _run(*GPT2, *args)
    assert code == 2, out
    assert flag in out, out


def test_stages_beyond_the_cluster_are_refused() -> None:
    code, out = _run(*JOB, "--micro-batch", "1", "--cluster", FRAGMENTED, "--stage", "4xA100-80GB:20:tp2",
                     "--stage", "8xL4:20:tp4")  # fmt: skip
    assert code == 2 and "--stage" in out and "A100-80GB 4 > 2" in out
