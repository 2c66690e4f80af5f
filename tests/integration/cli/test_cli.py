"""The `frenzy` command as a user runs it: a real subprocess, real servers.

Bad input must exit non-zero with a message naming the field, exactly as the
gRPC API and the batch path report it; nothing may be left in Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from frenzy.state.keys import Keys
from support.servers import Servers, running_servers
from support.state import add_node

FRENZY = [sys.executable, "-m", "frenzy.cli.main"]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*FRENZY, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, stdin=subprocess.DEVNULL)


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "l4-0", "L4", 2, memory=23 * 1024**3)
    with running_servers(redis_url, prefix) as s:
        yield s


def test_help_teaches() -> None:
    res = run("--help")
    assert res.returncode == 0
    for cmd in ("predict", "submit", "jobs", "job", "cancel", "nodes", "up", "demo", "agent", "scheduler",
                "predictor", "worker", "batch", "models"):
        assert cmd in res.stdout, cmd
    sub = run("predict", "--help")
    assert sub.returncode == 0 and "--seq-len" in sub.stdout and "Example" in sub.stdout


def test_models_and_gpus_json() -> None:
    models = json.loads(run("models", "--json").stdout)
    names = {m["name"] for m in models}
    assert {"gpt2-124m", "llama-2-7b", "llama-3.1-8b", "mistral-7b", "qwen2.5-72b"} <= names
    gpus = json.loads(run("gpus", "--json").stdout)
    assert {"A100-80GB", "H100-80GB", "L4", "T4"} <= {g["name"] for g in gpus}


def test_predict_prints_ranked_plans_as_json() -> None:
    res = run("predict", "--model", "llama-2-7b", "--seq-len", "2048", "--global-batch", "16", "--micro-batch", "1",
              "--json")
    assert res.returncode == 0, res.stderr
    plans = json.loads(res.stdout)
    assert plans and all(p["peak_bytes_per_gpu"] <= p["gpu_memory_bytes"] for p in plans)
    assert [p["rank"] for p in plans] == sorted(p["rank"] for p in plans)


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--model", "llama-9-7b"], 2, "model"),
        (["--model", "gpt2-124m", "--global-batch", "-4"], 2, "global_batch"),
        (["--model", "gpt2-124m", "--global-batch", "0"], 2, "global_batch"),
        (["--model", "gpt2-124m", "--gpu-type", "B300-1TB"], 2, "gpu"),
        (["--model", "gpt2-124m", "--precision", "fp8"], 2, "precision"),
        (["--model", "llama-2-70b", "--gpu-type", "T4", "--max-gpus", "1"], 3, "no GPU type"),
    ],
)
def test_predict_bad_input(args: list[str], code: int, needle: str) -> None:
    base = {"--seq-len": "1024", "--global-batch": "8"}
    full = list(args)
    for k, v in base.items():
        if k not in full:
            full += [k, v]
    res = run("predict", *full)
    assert res.returncode == code, (res.stdout, res.stderr)
    assert needle.lower() in (res.stderr + res.stdout).lower()


def test_predict_malformed_config(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}')
    res = run("predict", "--model", str(bad), "--seq-len", "1024", "--global-batch", "8")
    assert res.returncode == 2 and "config" in res.stderr.lower(), res.stderr
    bad.write_text("{oops")
    res = run("predict", "--model", str(bad), "--seq-len", "1024", "--global-batch", "8")
    assert res.returncode == 2 and "model" in res.stderr.lower(), res.stderr


def test_submit_bad_input_exits_with_field_and_writes_nothing(
    servers: Servers, redis_client: redis.Redis, keys: Keys,
) -> None:
    env = {"FRENZY_SCHEDULER": servers.scheduler_addr}
    cases = [
        (["--model", "nope-1b", "--seq-len", "128", "--global-batch", "8", "--", "true"], 2, "model"),
        (["--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "-1", "--", "true"], 2, "global_batch"),
        (["--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8"], 2, "command"),
        (["--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8", "--gpu-type", "X1", "--", "true"], 2,
         "gpu"),
        (["--model", "llama-2-70b", "--seq-len", "4096", "--global-batch", "8", "--", "true"], 3, "L4"),
    ]
    for args, code, needle in cases:
        res = run("submit", *args, env=env)
        assert res.returncode == code, (args, res.stdout, res.stderr)
        assert needle.lower() in res.stderr.lower(), (args, res.stderr)
    assert redis_client.zcard(keys.jobs()) == 0
    assert redis_client.zcard(keys.queue()) == 0


def test_submit_wait_jobs_job_nodes(servers: Servers) -> None:
    """A submission through the CLI is listed, shown and placed (no agent: it stays LAUNCHING)."""
    env = {"FRENZY_SCHEDULER": servers.scheduler_addr}
    res = run("submit", "--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8", "--name", "cli",
              "--json", "--", "python", "-c", "print(1)", env=env)
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job"]["id"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        job = json.loads(run("job", job_id, "--json", env=env).stdout)
        if job["state"] == "LAUNCHING":
            break
        time.sleep(0.1)
    assert job["state"] == "LAUNCHING", job
    assert job["spec"]["command"] == ["python", "-c", "print(1)"]
    listed = json.loads(run("jobs", "--json", env=env).stdout)
    assert [j["id"] for j in listed["jobs"]] == [job_id]  # GET /api/jobs's shape (test_api_job_json.py)
    nodes = json.loads(run("nodes", "--json", env=env).stdout)
    owners = [g["owner"] for n in nodes for g in n["gpus"]]
    assert job_id in owners
    shown = run("job", job_id, env=env)
    assert "CHOSEN" in shown.stdout and "LAUNCHING" in shown.stdout
    missing = run("job", "job-nope", env=env)
    assert missing.returncode == 4 and "NOT_FOUND" in missing.stderr


def test_unreachable_scheduler_says_how_to_fix() -> None:
    res = run("jobs", env={"FRENZY_SCHEDULER": "127.0.0.1:1"}, timeout=60)
    assert res.returncode == 1 and "To fix" in res.stderr


@pytest.mark.slow
def test_up_starts_the_stack_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {gpu: L4, count: 2, gpus_per_node: 1}\n")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.Popen([*FRENZY, "up", "--cluster", str(cluster), "--run-dir", str(tmp_path / "run"),
                             "--no-api"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    out = ""
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            out += line
            if "Ctrl-C" in line or proc.poll() is not None:
                break
        assert "Ctrl-C" in out, out
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a hung `up` must not outlive the test with its whole stack
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + rest
    assert "stopping" in rest
    # every service process it started is gone
    logs = list((tmp_path / "run").glob("*.log"))
    assert {p.stem for p in logs} >= {"predictor", "scheduler", "worker", "agent-l4-0", "agent-l4-1"}


def test_up_rejects_a_bad_cluster_file(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {gpu: Z9000, count: 2}\n")
    res = run("up", "--cluster", str(cluster), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2 and "nodes[0].gpu" in res.stderr, res.stderr
    cluster.write_text("nodes:\n  - {gpu: L4, count: -1}\n")
    res = run("up", "--cluster", str(cluster), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2 and "nodes[0].count" in res.stderr, res.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_servers_stop_cleanly_on_a_signal(sig: signal.Signals, redis_url: str, prefix: str) -> None:
    """predictor and scheduler: a signal once they listen stops them gracefully (exit 0, quickly)."""
    commands = {
        "predictor": [*FRENZY, "predictor", "--address", "127.0.0.1:0"],
        "scheduler": [*FRENZY, "scheduler", "--address", "127.0.0.1:0", "--predictor", "127.0.0.1:1",
                      "--redis-url", redis_url, "--prefix", prefix],
    }
    for name, cmd in commands.items():
        # (the predictor answers only the scheduler's token: it will not start without one, issue 34)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, "FRENZY_PREDICTOR_TOKEN": "frzp_" + "t" * 40})
        try:
            assert proc.stderr is not None
            deadline = time.monotonic() + 60
            seen = ""
            while "listening" not in seen and time.monotonic() < deadline and proc.poll() is None:
                seen = proc.stderr.readline()
            assert "listening" in seen, f"{name} did not start"
            proc.send_signal(sig)
            proc.communicate(timeout=20)
            assert proc.returncode == 0, f"{name} exited {proc.returncode} on {sig.name}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_submit_carries_the_recipe_flags_predict_has(servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    """`frenzy submit` plans a job the way it will run: the recipe flags reach the stored JobSpec."""
    add_node(redis_client, keys, "h0", "H100-80GB", 8)
    env = {"FRENZY_SCHEDULER": servers.scheduler_addr}
    res = run("submit", "--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8", "--no-code", "--json",
              "--finetune", "lora", "--lora-rank", "8", "--lora-targets", "q,v", "--weight-decay", "0.1",
              "--pp-layers", "6,6", "--compile", "--float8", "--lora-dropout", "0.1", "--lora-adapter-dtype", "compute",
              "--fsdp-reshard", "all", "--qlora-backend", "torchao", "--", "true", env=env)
    assert res.returncode == 0, res.stderr
    recipe = json.loads(res.stdout)["job"]["spec"]["recipe"]
    assert recipe["finetune"] == "LORA" and recipe["lora_rank"] == 8 and recipe["lora_targets"] == ["q", "v"]
    assert recipe["pp_layers"] == [6, 6] and recipe["compile"] and recipe["float8"]
    assert abs(recipe["weight_decay"] - 0.1) < 1e-9 and abs(recipe["lora_dropout"] - 0.1) < 1e-9
    assert (recipe["lora_adapter_dtype"], recipe["fsdp_reshard"], recipe["qlora_backend"]) == ("compute", "all",
                                                                                                 "torchao")
    bad = run("submit", "--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8", "--no-code",
              "--lora-targets", "q,nope", "--", "true", env=env)
    assert bad.returncode == 2 and "lora_targets" in bad.stderr, bad.stderr
    bad = run("submit", "--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8", "--no-code",
              "--qlora-backend", "hqq", "--", "true", env=env)
    assert bad.returncode == 2 and "qlora_backend" in bad.stderr and "torchao" in bad.stderr, bad.stderr
