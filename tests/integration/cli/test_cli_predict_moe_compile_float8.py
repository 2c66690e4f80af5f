"""`frenzy predict --etp / --lora-targets / --compile / --float8` (issue 16), in single-layout and
ranked mode; bad values exit 2 naming the flag, a GPU without fp8 is refused by name."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

RUN = CliRunner()
MOE = ('{"arch": "decoder", "head": "lm", "n_layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn": 2048, '
       '"mlp": "swiglu", "vocab": 32000, "tied_embeddings": false, "pos_emb": "rope", "max_positions": 8192, '
       '"norm": "rmsnorm", "bias": false, "experts": 8, "top_k": 2}')  # fmt: skip
SINGLE = ["predict", "--model", "llama-3-8b", "--seq-len", "4096", "--micro-batch", "1", "--dp", "8", "--zero", "3",
          "--precision", "fsdp-bf16", "--gpu", "H100-80GB", "--json"]  # fmt: skip
RANKED = ["predict", "--model", "llama-3.2-1b", "--seq-len", "2048", "--global-batch", "16", "--max-gpus", "8",
          "--json"]  # fmt: skip


def _run(*args: str) -> tuple[int, str]:
    res = RUN.invoke(app, list(args))
    return res.exit_code, res.output


def _json(*args: str) -> dict:
    code, out = _run(*args)
    assert code == 0, out
    return json.loads(out)


def test_compile_and_float8_in_single_layout_mode() -> None:
    eager, compiled = _json(*SINGLE), _json(*SINGLE, "--compile")
    assert compiled["recipe"]["compile"] and compiled["breakdown"]["activations"] < eager["breakdown"]["activations"]
    fp8 = _json(*SINGLE, "--float8")
    assert fp8["recipe"]["float8"] and fp8["breakdown"]["buffers"] < eager["breakdown"]["buffers"]
    code, out = _run(*SINGLE[:-3], "--gpu", "A100-80GB", "--float8")
    assert code == 2 and "--float8" in out and "A100-80GB cannot run float8" in out


def test_etp_in_single_layout_mode() -> None:
    args = ["predict", "--model", MOE, "--seq-len", "2048", "--micro-batch", "1", "--dp", "8", "--tp", "2", "--zero",
            "1", "--precision", "master-bf16", "--ep", "4", "--sequence-parallel", "--gpu", "H100-80GB", "--json"]
    default, one = _json(*args), _json(*args, "--etp", "1")
    assert default["layout"]["etp"] == 2 and one["layout"]["etp"] == 1
    assert one["breakdown"]["parameters"] > default["breakdown"]["parameters"]  # whole experts on the rank
    code, out = _run(*args, "--etp", "3")  # 3 x ep 4 does not divide tp x dp = 16
    assert code == 2 and "--etp" in out


def test_lora_targets() -> None:
    lora = ["predict", "--model", "llama-3-8b", "--seq-len", "4096", "--micro-batch", "1", "--dp", "1", "--precision",
            "bf16", "--finetune", "lora", "--gpu", "H100-80GB", "--json"]  # fmt: skip
    few = _json(*lora, "--lora-targets", "q,v")
    every = _json(*lora, "--lora-targets", "q,k,v,o,gate,up,down")
    assert few["recipe"]["lora_targets"] == ["q", "v"]
    assert every["breakdown"]["optimizer_states"] > few["breakdown"]["optimizer_states"]
    code, out = _run(*RANKED, "--finetune", "lora", "--lora-targets", "q,x")
    assert code == 2 and "--lora-targets" in out


@pytest.mark.parametrize("extra", [[], ["--precision", "amp-bf16"]])  # the job-spec path, the library path
def test_ranked_mode_plans_float8_on_fp8_gpus_only(extra: list[str]) -> None:
    code, out = _run(*RANKED, *extra, "--float8", "--compile", "--finetune", "lora", "--lora-targets", "q,v",
                     "--gpu-type", "A100-80GB", "--gpu-type", "H100-80GB")  # fmt: skip
    assert code == 0, out
    plans = json.loads(out)
    assert plans and {p["gpu_type"] for p in plans} == {"H100-80GB"}
    code, out = _run(*RANKED, *extra, "--etp", "2")
    assert code == 2 and "--etp" in out and "mixture-of-experts" in out
