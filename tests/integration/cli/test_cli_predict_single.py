"""`frenzy predict` single-layout mode: the JSON contract automation relies on, and its errors.

In-process through typer's CliRunner (the subprocess behaviour of the command is covered by
test_cli.py); each bad flag must exit 2 with a message naming that flag."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

RUN = CliRunner()
BASE = ["predict", "--model", "llama-3-8b", "--seq-len", "8192", "--micro-batch", "2"]


def _run(*args: str) -> tuple[int, str]:
    res = RUN.invoke(app, list(args))
    return res.exit_code, res.output


def test_single_layout_json_contract() -> None:
    code, out = _run(*BASE, "--precision", "fsdp-bf16", "--dp", "8", "--tp", "1", "--pp", "1", "--zero", "3",
                     "--recompute", "op-sac", "--attention", "flash", "--loss", "torch", "--gpu", "H100-80GB",
                     "--json")  # fmt: skip
    assert code == 0, out
    d = json.loads(out)
    assert {"fits", "peak_allocated_bytes", "reserved_bytes", "device_bytes", "breakdown"} <= set(d)
    assert d["peak_allocated_bytes"] <= d["reserved_bytes"] < d["device_bytes"]
    b = d["breakdown"]
    assert sum(b.values()) == d["device_bytes"]
    assert d["fits"] is (d["device_bytes"] <= d["gpu_memory_bytes"])
    assert d["recipe"]["precision"] == "fsdp-bf16" and d["layout"]["zero_stage"] == 3


def test_layout_that_does_not_fit_still_prints_the_prediction() -> None:
    code, out = _run("predict", "--model", "llama-2-70b", "--seq-len", "4096", "--micro-batch", "1", "--dp", "1",
                     "--gpu", "L4", "--json")  # fmt: skip
    assert code == 3, out
    d = json.loads(out)
    assert d["fits"] is False and d["device_bytes"] > d["gpu_memory_bytes"]


def test_bf16_is_pure_bf16_in_single_mode_and_stage_picks_the_stage() -> None:
    args = ["--dp", "1", "--pp", "4", "--global-batch", "16", "--gpu", "A100-80GB", "--json"]
    pure = json.loads(_run(*BASE, "--precision", "bf16", *args)[1])
    master = json.loads(_run(*BASE, "--precision", "master-bf16", *args)[1])
    assert pure["recipe"]["precision"] == "pure-bf16"
    # pure bf16 Adam keeps 2 bf16 states (4 B/param), master-bf16 fp32 master + 2 states (12 B/param)
    assert master["breakdown"]["optimizer_states"] == pytest.approx(3 * pure["breakdown"]["optimizer_states"], rel=1e-6)
    first = json.loads(_run(*BASE, *args, "--stage", "first")[1])
    last = json.loads(_run(*BASE, *args, "--stage", "last")[1])
    worst = json.loads(_run(*BASE, *args, "--stage", "max")[1])
    assert first["breakdown"]["logits"] == 0 and last["breakdown"]["logits"] > 0
    assert worst["device_bytes"] == max(first["device_bytes"], last["device_bytes"])


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--tp", "3", "--gpu", "H100-80GB"], "--tp"),
        (["--dp", "1", "--sequence-parallel", "--gpu", "H100-80GB"], "--sequence-parallel"),
        (["--dp", "1", "--recompute", "partial", "--gpu", "H100-80GB"], "--recompute"),
        (["--dp", "1", "--attention", "sparse", "--gpu", "H100-80GB"], "--attention"),
        (["--dp", "1", "--loss", "hinge", "--gpu", "H100-80GB"], "--loss"),
        (["--dp", "1", "--precision", "fp8", "--gpu", "H100-80GB"], "--precision"),
        (["--dp", "1", "--optimizer", "lion", "--gpu", "H100-80GB"], "--optimizer"),
        (["--dp", "1", "--zero", "5", "--gpu", "H100-80GB"], "--zero"),
        (["--dp", "1", "--stage", "middle", "--gpu", "H100-80GB"], "--stage"),
        (["--dp", "1"], "--gpu"),
        (["--dp", "1", "--gpu", "B300"], "--gpu"),
        (["--dp", "1", "--pp", "1", "--vpp", "2", "--gpu", "H100-80GB"], "--vpp"),
        (["--dp", "3", "--global-batch", "16", "--gpu", "H100-80GB"], "--global-batch"),
        (["--dp", "1", "--gpu-type", "L4", "--gpu", "H100-80GB"], "--gpu-type"),
        (["--dp", "1", "--precision", "fsdp-bf16", "--zero", "1", "--gpu", "H100-80GB"], "--zero"),
        (["--dp", "1", "--cp", "2", "--attention", "eager", "--gpu", "H100-80GB"], "--cp"),
    ],
)
def test_bad_or_contradictory_flags_name_the_flag(extra: list[str], flag: str) -> None:
    code, out = _run(*BASE, *extra)
    assert code == 2, out
    assert flag in out


def test_ranked_mode_new_policies_and_rank_by() -> None:
    code, out = _run("predict", "--model", "llama-2-7b", "--seq-len", "2048", "--global-batch", "16",
                     "--precision", "pure-bf16", "--rank-by", "gpu_hours", "--json")  # fmt: skip
    assert code == 0, out
    plans = json.loads(out)
    hours = [p["gpu_hours"] for p in plans]
    assert hours == sorted(hours) and all(p["explanation"] for p in plans)
    code, out = _run("predict", "--model", "llama-2-7b", "--seq-len", "2048", "--global-batch", "16",
                     "--rank-by", "vibes")  # fmt: skip
    assert code == 2 and "--rank-by" in out
