"""Near-valid jobs through the REST API to a real scheduler and predictor (issue 14): the schema's
generator (test_rest_schemathesis.py) seldom writes a job that passes validation, so these start
from a good job and push its numbers and its model to the edges (limits, inline configs with huge
layers) where the scheduler and the predictor, not the validator, have to answer. Never a 5xx;
an accepted job can be read, its logs listed and cancelled."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.rpc.jobspec import MAX_BATCH, MAX_SEQ_LEN, MAX_TRAIN_STEPS
from support.servers import Servers

pytestmark = pytest.mark.slow

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
GOOD = {"name": "fuzz", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": ["python", "t.py"]}


def _edge_ints(top: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([0, 1, 2, 3, 7, top - 1, top, top + 1, 2**31, 2**63]),
                     st.integers(min_value=1, max_value=top))


layer = st.one_of(st.sampled_from([1, 2, 64, 4096, 2**20, 2**31, 2**40, 2**62]), st.integers(1, 10**6))
hf_llama = st.fixed_dictionaries({
    "architectures": st.just(["LlamaForCausalLM"]), "hidden_size": layer, "num_attention_heads": layer,
    "num_hidden_layers": layer, "intermediate_size": layer, "vocab_size": layer,
    "num_key_value_heads": layer, "max_position_embeddings": layer,
})
neutral = st.fixed_dictionaries({
    "arch": st.sampled_from(["decoder", "encoder"]), "head": st.just("lm"), "n_layers": layer, "hidden": layer,
    "heads": layer, "kv_heads": layer, "ffn": layer, "mlp": st.sampled_from(["gelu", "swiglu"]), "vocab": layer,
    "tied_embeddings": st.booleans(), "pos_emb": st.sampled_from(["learned", "rope"]), "max_positions": layer,
    "norm": st.sampled_from(["layernorm", "rmsnorm"]), "bias": st.booleans(),
    "experts": st.sampled_from([0, 0, 8, 2**20]), "top_k": st.sampled_from([0, 1, 2]),
})
models = st.one_of(st.sampled_from(["gpt2-124m", "llama-3-8b", "qwen2.5-72b", "llama-2-70b", "nope"]),
                   hf_llama, neutral)
jobs = st.fixed_dictionaries({"model": models}, optional={
    "seq_len": _edge_ints(MAX_SEQ_LEN), "global_batch": _edge_ints(MAX_BATCH), "micro_batch": _edge_ints(MAX_BATCH),
    "train_steps": _edge_ints(MAX_TRAIN_STEPS), "max_gpus": st.sampled_from([0, 1, 2, 4, 8, 2**20]),
    "precision": st.sampled_from(["fp32", "bf16", "amp-fp16", "pure-bf16"]),
    "optimizer": st.sampled_from(["adamw", "sgd", "adam8bit"]), "allow_recompute": st.booleans(),
    "gpu_types": st.lists(st.sampled_from(["A100-80GB", "L4", "H100-80GB", "x"]), max_size=3),
}).map(lambda over: {**GOOD, **over})


@pytest.fixture(scope="module")
def client(app: FastAPI, servers: Servers) -> Iterator[TestClient]:
    with TestClient(app, headers={"authorization": f"Bearer {servers.token}"}) as c:
        yield c


@SETTINGS
@given(jobs)
@example({**GOOD, "seq_len": MAX_SEQ_LEN, "global_batch": MAX_BATCH, "micro_batch": MAX_BATCH})
@example({**GOOD, "model": {"arch": "decoder", "head": "lm", "n_layers": 2**40, "hidden": 2**40, "heads": 1,
                            "kv_heads": 1, "ffn": 2**40, "mlp": "gelu", "vocab": 2**40, "tied_embeddings": True,
                            "pos_emb": "learned", "max_positions": 2**40, "norm": "layernorm", "bias": True}})
def test_near_valid_jobs_never_5xx(client: TestClient, job: dict) -> None:
    r = client.post("/api/jobs", json=job)
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        assert r.status_code in (400, 409, 429), (r.status_code, r.text[:500])
        return
    job_id = r.json()["id"]
    for url in (f"/api/jobs/{job_id}", f"/api/jobs/{job_id}/logs?attempt=1&tail_lines=5", "/api/jobs?limit=3"):
        got = client.get(url)
        assert got.status_code == 200, (url, got.status_code, got.text[:500])
    cancelled = client.post(f"/api/jobs/{job_id}/cancel", json={"reason": "fuzz"})
    assert cancelled.status_code in (200, 409), (cancelled.status_code, cancelled.text[:500])
