"""Resuming after a move: examples/train_resume.py saves DCP checkpoints to FRENZY_CHECKPOINT_DIR, and a
run on another layout picks up where the last one saved instead of starting over.

* by hand, under torchrun on CPU (gloo): two processes with FSDP2 train 6 steps and stop, then one
  process (FSDP2), or two with DDP, load the step-6 checkpoint, resharded, and train on; their losses
  and final parameters are those of a run that was never interrupted, and a checkpoint cut short
  (``.tmp``) is never loaded;
* through the whole stack (LocalStack: agents with ``--checkpoint-root``): a job that runs out of memory
  after step 6 of its first attempt is re-planned, and attempt 2 (same FRENZY_CHECKPOINT_DIR) resumes
  from step 6 and ends SUCCEEDED with the uninterrupted run's parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e.test_agents_e2e import DONE, TORCHRUN, Stack, make_stack  # noqa: F401 (the fixture)

from frenzy.v1 import types_pb2

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TRAIN_RESUME = ROOT / "examples" / "train_resume.py"
STEPS = ["--steps", "10", "--save-every", "3"]


def _run(world: int, ckpt: Path, report: Path, *args: str) -> str:
    """One run of the example under torchrun (``world`` processes on this host); its output."""
    cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={world}", str(TRAIN_RESUME), *STEPS,
           "--report", str(report), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRENZY_", "PET_"))}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=100,
                         env={**env, "FRENZY_CHECKPOINT_DIR": str(ckpt)})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _report(path: Path) -> dict:
    data = json.loads(path.read_text())
    data["losses"] = {int(k): v for k, v in data["losses"].items()}
    return data


def _max_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    assert a.keys() == b.keys() and a
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """10 steps in one process, never interrupted."""
    tmp = tmp_path_factory.mktemp("reference")
    _run(1, tmp / "ckpt", tmp / "report.json")
    return _report(tmp / "report.json")


@pytest.mark.parametrize(("world", "wrap"), [(1, "fsdp"), (2, "ddp")])
def test_a_run_moved_to_another_layout_resumes_where_fsdp_on_two_ranks_saved(
        tmp_path: Path, reference: dict, world: int, wrap: str) -> None:
    ckpt = tmp_path / "ckpt"
    first = _run(2, ckpt, tmp_path / "first.json", "--stop-after", "6")
    assert "starting at step 0" in first and "saved step 6" in first
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000003", "step-00000006"]
    before = _report(tmp_path / "first.json")
    assert (before["world"], sorted(before["losses"])) == (2, [0, 1, 2, 3, 4, 5])
    # A checkpoint some run was writing when it died: newer, but incomplete, so never loaded.
    (ckpt / "step-00000009.tmp").mkdir()

    second = _run(world, ckpt, tmp_path / "second.json", "--wrap", wrap)
    assert f"[rank 0/{world}] resumed from step 6 (" in second and "starting at step 0" not in second
    after = _report(tmp_path / "second.json")
    assert (after["resumed_from"], after["world"], sorted(after["losses"])) == (6, world, [6, 7, 8, 9])
    # The same trajectory as the run that was never stopped: the weights, Adam's moments and its
    # step count all came back (a restart from step 0, or from fresh optimizer state, would differ).
    for step, loss in {**before["losses"], **after["losses"]}.items():
        assert loss == pytest.approx(reference["losses"][step], rel=1e-4), step
    assert _max_diff(after["params"], reference["params"]) < 1e-5
    assert (ckpt / "step-00000010").is_dir()


def test_without_a_checkpoint_dir_it_trains_from_scratch_every_time(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRENZY_", "PET_", "RANK"))}
    for _ in range(2):
        out = subprocess.run([sys.executable, str(TRAIN_RESUME), "--steps", "2"], capture_output=True, text=True,
                             timeout=60, env=env, cwd=tmp_path)
        assert out.returncode == 0 and "starting at step 0; no checkpoint in (no checkpoint dir)" in out.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
def test_an_oom_job_re_planned_by_the_scheduler_resumes_from_its_first_attempts_checkpoint(
        make_stack: Callable[..., Stack], tmp_path: Path, reference: dict) -> None:  # noqa: F811
    s = make_stack({"nodes": [{"gpu": "L4", "count": 2, "gpus_per_node": 1, "name_prefix": "l4"}]})
    report = tmp_path / "report.json"
    job_id = s.submit([TORCHRUN, str(TRAIN_RESUME), *STEPS, "--oom-at", "6", "--report", str(report)],
                      model="gpt2-124m", seq_len=1024, global_batch=16)
    job = s.wait_state(job_id, DONE, timeout=120)
    text = s.text(job_id)
    assert job.state == types_pb2.JOB_STATE_SUCCEEDED, (job, text)
    first, second = job.attempts
    assert (first.cause, second.outcome) == ("oom", "succeeded"), job
    ckpt = s.stack.run_dir / "checkpoints" / job_id
    assert "resumed from step 6 (" + str(ckpt / "step-00000006") in text
    done = _report(report)
    assert (done["resumed_from"], sorted(done["losses"])) == (6, [6, 7, 8, 9])
    # Each attempt ran as many ranks as its plan has GPUs (the agents' torchrun options): the world
    # the checkpoint was saved from and the one it was loaded into are the two plans' (measured: 1 x L4,
    # one rank, then 2 x L4 on two nodes, two ranks over gloo).
    assert f"[rank 0/{first.num_gpus}] starting at step 0" in text and done["world"] == second.num_gpus
    assert _max_diff(done["params"], reference["params"]) < 1e-5
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000003", "step-00000006", "step-00000009",
                                                     "step-00000010"]
