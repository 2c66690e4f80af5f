"""A mixed plan end to end (issue 33): the local stack (scheduler, predictor, one fake agent per node,
separate processes, real Redis) on examples/clusters/fragmented.yaml (2 A100-80GB, 8 L4, 8 A10G),
a model that fits no single pool there (Llama-2-13B, seq 4096, global batch 64), one job.

The predictor ranks a plan over two types first; HAS places each stage on nodes of its type in one
reservation; every node's agent starts the job's command, which starts one process per local rank
(as torchrun would, with LOCAL_RANK) and each prints its launch contract as frenzy.train parses it.
The test reads every rank's stage, layers, local batch and loss share from the job's own output,
checks them against the stored plan, and that the job SUCCEEDED on GPUs of two types."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from e2e.test_agents_e2e import DONE, Stack, make_stack  # noqa: F401 (the fixture)

from frenzy.v1 import types_pb2
from support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "fragmented.yaml"
JOB = {"model": "llama-2-13b", "seq_len": 4096, "global_batch": 64}

# The job: one process per local rank (LOCAL_RANK, as torchrun gives), each printing what its
# environment says of its share, parsed by the training-side helper a script would use.
RANK = r"""
import json, os
from frenzy.train import contract
c = contract.parse(os.environ)
names = ("FRENZY_NODE", "FRENZY_GPU_TYPE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", *contract.NAMES)
print("RANK " + json.dumps({"env": {n: os.environ.get(n) for n in names}, "stage": c.stage,
      "layers": [c.first_layer, c.last_layer], "micro_batch": c.local_micro_batch,
      "grad_accum": c.local_grad_accum, "loss_scale": str(c.loss_scale)}), flush=True)
"""
NODE = r"""
import os, subprocess, sys
n = int(os.environ["FRENZY_NPROC_PER_NODE"])
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[1]],
                          env={**os.environ, "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": str(n)}) for i in range(n)]
sys.exit(max(p.wait() for p in procs))
"""


def test_a_job_no_single_pool_holds_runs_on_a_mixed_plan(make_stack: Callable[..., Stack]) -> None:  # noqa: F811
    s = make_stack(yaml.safe_load(CLUSTER.read_text()))
    job_id = s.submit([sys.executable, "-c", NODE, RANK], **JOB)
    done = s.wait_state(job_id, DONE, timeout=120)
    assert done.state == types_pb2.JOB_STATE_SUCCEEDED, (done.state, done.history, s.text(job_id)[-2000:])

    best = done.candidate_plans[0]
    assert best.stages and len(best.gpus_by_type) == 2, best  # ranked first: a plan over two types
    chosen = done.plan  # the plan it ran on
    assert chosen.stages and len(chosen.gpus_by_type) == 2, chosen
    assert {p.node for p in done.placement} == {r for r in done.exit_codes}
    ranks = [json.loads(line[len("RANK "):]) for line in s.text(job_id).splitlines() if line.startswith("RANK {")]
    assert len(ranks) == chosen.num_gpus == sum(chosen.gpus_by_type.values())

    types_used = {r["env"]["FRENZY_NODE"].split("-")[0] for r in ranks}
    assert len(types_used) == 2, types_used  # ranks on nodes of two GPU types
    stages = {st.index: st for st in chosen.stages}
    global_batch = JOB["global_batch"]
    seen = set()
    for r in ranks:
        env = r["env"]
        assert all(env[n] is not None for n in ("FRENZY_STAGE", "FRENZY_STAGE_LAYERS", "FRENZY_LOCAL_MICRO_BATCH",
                                                 "FRENZY_LOCAL_GRAD_ACCUM", "FRENZY_LOSS_SCALE")), env
        st = stages[r["stage"]]
        (share,) = [sh for sh in st.shares if env["FRENZY_NODE"].startswith(_prefix(sh.gpu_type))]
        assert r["layers"] == [st.first_layer, st.last_layer]
        assert (r["micro_batch"], r["grad_accum"]) == (share.micro_batch, share.grad_accum)
        assert Fraction(r["loss_scale"]) == Fraction(share.micro_batch * share.grad_accum, global_batch)
        seen.add((env["FRENZY_NODE"], env["LOCAL_RANK"]))
    assert len(seen) == len(ranks)  # one line per rank
    assert sorted({r["stage"] for r in ranks}) == sorted(stages)  # every stage ran
    assert sorted({tuple(r["layers"]) for r in ranks})[0][0] == 0


def _prefix(gpu_type: str) -> str:
    """The node name prefix fragmented.yaml gives a type's nodes."""
    return {"A100-80GB": "a100", "L4": "l4", "A10G": "a10g"}[gpu_type]


def test_under_frenzy_single_type_the_job_waits_and_says_why(make_stack: Callable[..., Stack]) -> None:  # noqa: F811
    s = make_stack(yaml.safe_load(CLUSTER.read_text()), policy="frenzy-single-type")
    job_id = s.submit([sys.executable, "-c", "print('never')"], **JOB)
    job = wait_for(lambda: "mixed plans" in (j := s.job(job_id)).pending_reason and j, 30, "the pending reason")
    assert job.state == types_pb2.JOB_STATE_PENDING  # type: ignore[union-attr]
    assert "mixed plans are off (policy frenzy-single-type): it would fit now" in job.pending_reason  # type: ignore[union-attr]
