"""`frenzy predict` ranked mode when no GPU type can hold the job: exit 3 with a "To fix:" whose
suggestions were checked by planning again (issue 30), on both ranked paths -- the predictor
service's (job-spec precisions) and MARP's own (the other policies)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from frenzy.cli import predict_fixes
from frenzy.cli.main import app

RUN = CliRunner()
# 70B on at most two L4s, micro batch 2, no recomputation: nothing fits.
TIGHT = ["predict", "--model", "llama-2-70b", "--seq-len", "1024", "--global-batch", "8", "--gpu-type", "L4",
         "--max-gpus", "2", "--micro-batch", "2", "--no-recompute"]  # fmt: skip


def _without(args: list[str], *flags: str) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in flags:
            skip = a != "--no-recompute" and i + 1 < len(args)
            continue
        out.append(a)
    return out


@pytest.mark.parametrize("precision", ["bf16", "master-bf16"])  # the predictor's path, MARP's own
def test_no_plan_exits_3_with_checked_fixes(precision: str) -> None:
    args = [*TIGHT, "--precision", precision]
    res = RUN.invoke(app, [*args, "--json"])
    assert res.exit_code == 3, res.output
    assert json.loads(res.stdout) == []  # stdout stays JSON
    err = " ".join(res.stderr.split())  # rich folds long lines
    assert "no GPU type can hold this job" in err and "To fix: any one of these is enough (each checked with MARP" in err, err
    # The fewest limits to lift: GPU types and the GPU count together (neither alone is enough).
    assert "drop --gpu-type (plan over every GPU type) and drop --max-gpus: 16 x B200" in err, err
    # ... and it is true: planning without those two gives that plan.
    again = RUN.invoke(app, [*_without(args, "--gpu-type", "--max-gpus"), "--json"])
    assert again.exit_code == 0, again.output
    best = json.loads(again.stdout)[0]
    assert (best["num_gpus"], best["gpu_type"]) == (16, "B200")
    # Lifting only the GPU count keeps L4 and needs recomputation as well: also named, also true.
    assert "drop --max-gpus and allow recomputation" in err
    l4 = RUN.invoke(app, [*_without(args, "--max-gpus", "--no-recompute"), "--json"])
    assert l4.exit_code == 0 and json.loads(l4.stdout)[0]["gpu_type"] == "L4"


def test_no_plan_table_mode_does_not_repeat_the_rejections() -> None:
    res = RUN.invoke(app, TIGHT)
    assert res.exit_code == 3
    assert "no fit" in res.stdout and "nearest plan" in res.stdout
    assert "To fix" in res.stderr and "nearest plan" not in res.stderr  # said once, in the table


def test_a_cluster_file_that_cannot_hold_the_job_names_the_gpu_types_that_can() -> None:
    res = RUN.invoke(app, ["predict", "--model", "llama-2-70b", "--seq-len", "1024", "--global-batch", "8",
                           "--cluster", "examples/cluster.yaml"])  # fmt: skip
    assert res.exit_code == 3, res.output
    assert "drop --cluster (plan over every GPU type):" in " ".join(res.stderr.split()), res.stderr


def _fake(works: set[frozenset[str]]) -> Any:
    """An ``attempt`` that finds a plan only when one of ``works`` is among the overrides' keys."""
    calls: list[dict[str, Any]] = []

    def attempt(ov: dict[str, Any]) -> str | None:
        calls.append(ov)
        return "8 x H100" if any(w <= set(ov) for w in works) else None

    attempt.calls = calls  # type: ignore[attr-defined]
    return attempt


def test_ranked_fixes_names_the_fewest_limits_to_lift() -> None:
    attempt = _fake({frozenset({"max_gpus", "micro_batch"})})
    found = predict_fixes.ranked_fixes(attempt, restricted_types="--gpu-type", max_gpus=2, micro_batch=4,
                                       recompute_forbidden=True, seq_len=4096)  # fmt: skip
    assert found == ["drop --max-gpus and --micro-batch 0 (the planner chooses): 8 x H100"]
    assert all("seq_len" not in c for c in attempt.calls)  # the job itself is not changed when a limit suffices


def test_ranked_fixes_shortens_the_sequence_only_as_a_last_resort() -> None:
    attempt = _fake(set())
    assert predict_fixes.ranked_fixes(attempt, restricted_types=None, max_gpus=0, micro_batch=0,
                                      recompute_forbidden=False, seq_len=4096) == []  # fmt: skip
    assert [c["seq_len"] for c in attempt.calls] == [2048, 1024, 512, 256, 128]
    text = predict_fixes.ranked_fix_text([])
    assert text.startswith("To fix:") and "--finetune lora" in text

    def short_enough(ov: dict[str, Any]) -> str | None:
        return "4 x B200" if ov.get("seq_len", 4096) <= 1024 and ov.get("max_gpus") == 0 else None

    found = predict_fixes.ranked_fixes(short_enough, restricted_types=None, max_gpus=8, micro_batch=0,
                                       recompute_forbidden=False, seq_len=4096)  # fmt: skip
    assert found == ["--seq-len 1024 and drop --max-gpus: 4 x B200"]
