"""A job submitted over REST with issue 16's recipe fields (pp_layers, etp, lora_targets, compile,
float8, lora_adapter_dtype, fsdp_reshard, qlora_backend) is planned the way it will run: the fields reach the stored JobSpec and the predictor's
candidate plans follow them (float8 only on fp8 GPUs, every plan running the pipeline split).
Real scheduler and predictor on loopback, real Redis."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import redis

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.api.app import create_app
from frenzy.state.keys import Keys
from support.servers import running_servers
from support.state import add_node

GiB = 1024**3
GOOD = {"name": "i16", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "python -c 'print(1)'"}


@pytest.fixture
def client(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[TestClient]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 4)
    add_node(redis_client, keys, "l4-0", "L4", 4, memory=23 * GiB)
    with running_servers(redis_url, prefix) as s, TestClient(
        create_app(s.scheduler_addr), base_url="http://localhost", headers={"authorization": f"Bearer {s.token}"}
    ) as c:
        yield c


def test_the_fields_reach_the_spec_and_the_plans(client: TestClient) -> None:
    body = {**GOOD, "pp_layers": "2,4,4,2", "compile": True, "float8": True, "finetune": "lora",
            "lora_targets": ["q", "v", "up"]}  # fmt: skip
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 200, r.text
    job = r.json()["job"]
    recipe = job["spec"]["recipe"]
    assert recipe["pp_layers"] == [2, 4, 4, 2] and recipe["compile"] and recipe["float8"]
    assert recipe["lora_targets"] == ["q", "v", "up"]
    plans = job["candidate_plans"]
    assert plans and {p["gpu_type"] for p in plans} == {"L4"}  # the A100s have no fp8
    assert all((p["layout"]["pp"], p["layout"].get("vpp", 1) or 1) in {(2, 2), (4, 1)} for p in plans)


def test_the_framework_fields_reach_the_spec(client: TestClient) -> None:
    body = {**GOOD, "precision": "pure-bf16", "finetune": "qlora", "lora_adapter_dtype": "compute",
            "fsdp_reshard": "all", "qlora_backend": "torchao"}  # fmt: skip
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 200, r.text
    recipe = r.json()["job"]["spec"]["recipe"]
    assert (recipe["lora_adapter_dtype"], recipe["fsdp_reshard"], recipe["qlora_backend"]) == ("compute", "all",
                                                                                                 "torchao")
    r = client.post("/api/jobs", json={**GOOD, "precision": "fp16", "main_grad_dtype": "half"})
    assert r.status_code == 200, r.text
    assert r.json()["job"]["spec"]["recipe"]["main_grad_dtype"] == "half"


@pytest.mark.parametrize(
    ("over", "status", "field"),
    [({"pp_layers": "2,x"}, 400, "pp_layers"), ({"lora_targets": "q,w"}, 400, "lora_targets"),
     ({"etp": 0}, 400, "etp"), ({"pp_layers": [2, 4, 4, 1]}, 400, "pp_layers"),  # 11 of gpt2's 12 layers
     ({"etp": 2}, 400, "etp"),  # a dense model
     ({"lora_adapter_dtype": "bf16"}, 400, "lora_adapter_dtype"), ({"fsdp_reshard": "none"}, 400, "fsdp_reshard"),
     ({"qlora_backend": "hqq"}, 400, "qlora_backend"), ({"main_grad_dtype": "bf16"}, 400, "main_grad_dtype")],
)  # fmt: skip
def test_bad_fields_name_the_field(client: TestClient, over: dict, status: int, field: str) -> None:
    r = client.post("/api/jobs", json={**GOOD, **over})
    assert r.status_code == status, r.text
    assert field in r.json()["detail"], r.text
