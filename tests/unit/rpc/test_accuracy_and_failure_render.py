"""`frenzy accuracy`'s grouping (pure) and what `--wait` / `frenzy job` print for a failed job."""

from __future__ import annotations

import pytest

from frenzy.cli import render
from frenzy.cli.cmd_accuracy import accuracy_rows
from frenzy.rpc.listing import job_summary
from frenzy.v1 import types_pb2

GiB = 2**30


def attempt(n: int, predicted: float, observed: float, gpus: int = 1, cause: str = "", outcome: str = "succeeded",
            gpu: str = "L4", mb: int = 4) -> types_pb2.Attempt:
    return types_pb2.Attempt(attempt=n, gpu_type=gpu, num_gpus=gpus, predicted_peak_bytes=int(predicted * GiB),
                             observed_peak_bytes=int(observed * GiB), gpu_memory_bytes=24 * GiB, cause=cause,
                             outcome=outcome, exit_code=1 if cause else 0, node="l4-0",
                             tail=["x"] * 3 if cause else [],
                             layout=types_pb2.Layout(tp=1, pp=1, dp=gpus, zero_stage=1, micro_batch=mb,
                                                     recompute="none"))


def job(job_id: str, *attempts: types_pb2.Attempt, state: int = types_pb2.JOB_STATE_SUCCEEDED) -> types_pb2.Job:
    j = types_pb2.Job(id=job_id, model_name="gpt2-124m", state=state)
    j.attempts.extend(attempts)
    return j


def test_attempts_are_grouped_by_model_gpu_and_layout_with_the_error() -> None:
    jobs = [job("j1", attempt(1, 20, 22, cause="oom", outcome="requeued: out of memory"), attempt(2, 10, 11, gpus=2)),
            job("j2", attempt(1, 10, 9, gpus=2)),
            job("j3", attempt(1, 10, 0, gpus=2)),  # not observed: counted, not in the ratios
            job("j4", attempt(1, 10, 0, gpus=2, outcome="running"))]  # still running: left out
    rows = accuracy_rows(jobs)
    assert [(r.layout, r.attempts, r.observed, r.ooms) for r in rows] == [
        ("2 GPUs tp1 pp1 dp2 z1 mb4", 3, 2, 0), ("1 GPUs tp1 pp1 dp1 z1 mb4", 1, 1, 1)]
    two = rows[0]
    assert two.ratio == pytest.approx((1.1 + 0.9) / 2) and two.worst_ratio == pytest.approx(1.1)
    assert two.predicted_gib == pytest.approx(10) and two.observed_gib == pytest.approx(10)
    assert rows[1].ratio == pytest.approx(1.1) and rows[1].gpu_memory_gib == 24
    per_job = accuracy_rows(jobs, per_job=True)
    assert sorted(r.model for r in per_job) == ["gpt2-124m (j1)", "gpt2-124m (j1)", "gpt2-124m (j2)", "gpt2-124m (j3)"]
    assert accuracy_rows([job("j", attempt(1, 10, 0))])[0].ratio is None


def test_a_failed_jobs_cause_and_last_lines_are_shown() -> None:
    j = job("j1", attempt(1, 20, 22, cause="oom", outcome="failed: out of memory"), state=types_pb2.JOB_STATE_FAILED)
    j.history.add(state=types_pb2.JOB_STATE_FAILED, at=1.0, reason="out of memory on 1 x L4; To fix: more GPUs")
    lines = render.failure_lines(j)
    assert lines[0] == "[red]failed:[/] out of memory on 1 x L4; To fix: more GPUs"
    assert lines[1] == "[red]cause:[/] out of memory on node l4-0 (attempt 1, exit code 1)"
    assert lines[2].startswith("last 3 lines of its output") and lines[3:] == ["  x"] * 3
    assert render.failure_lines(job("ok", attempt(1, 1, 1))) == []
    # Job output is shown, never interpreted as markup.
    j.attempts[0].tail[:] = ["[bold]not markup[/]"]
    assert render.failure_lines(j)[-1] == "  \\[bold]not markup\\[/]"


def test_a_listing_row_drops_the_tails() -> None:
    j = job("j1", attempt(1, 20, 22, cause="oom"))
    assert list(job_summary(j).attempts[0].tail) == [] and job_summary(j).attempts[0].cause == "oom"
