"""`frenzy predict` flags for what MARP already models (issue 16): --finetune, --lora-rank, --lora-dropout,
--lora-adapter-dtype, --fsdp-reshard, --qlora-backend, --weight-decay and --ep, in single-layout and
ranked mode; bad values exit 2 naming the flag, and a GPU that cannot run the precision is refused by name."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

RUN = CliRunner()
SINGLE = ["predict", "--model", "llama-3-8b", "--seq-len", "4096", "--micro-batch", "1", "--dp", "8", "--zero", "3",
          "--precision", "bf16", "--gpu", "H100-80GB", "--json"]  # fmt: skip
RANKED = ["predict", "--model", "llama-3-8b", "--seq-len", "2048", "--global-batch", "16", "--gpu-type", "A100-80GB",
          "--max-gpus", "8", "--json"]  # fmt: skip
MOE = ('{"arch": "decoder", "head": "lm", "n_layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn": 2048, '
       '"mlp": "swiglu", "vocab": 32000, "tied_embeddings": false, "pos_emb": "rope", "max_positions": 8192, '
       '"norm": "rmsnorm", "bias": false, "experts": 8, "top_k": 2}')  # fmt: skip


def _run(*args: str) -> tuple[int, str]:
    res = RUN.invoke(app, list(args))
    return res.exit_code, res.output


def _json(*args: str) -> object:
    code, out = _run(*args)
    assert code == 0, out
    return json.loads(out)


def _by_layout(plans: object) -> dict[tuple[str, int, str], dict]:
    """Ranked plans' memory by (GPU type, GPUs, layout): the same plan across two runs."""
    assert isinstance(plans, list) and plans
    return {(p["gpu_type"], p["num_gpus"], str(p["layout"])): p["memory"] for p in plans}


def test_single_layout_finetune_and_weight_decay() -> None:
    full = _json(*SINGLE)
    lora = _json(*SINGLE, "--finetune", "lora", "--lora-rank", "8")
    qlora = _json(*SINGLE, "--finetune", "qlora", "--lora-rank", "8")
    assert isinstance(full, dict) and isinstance(lora, dict) and isinstance(qlora, dict)
    assert lora["recipe"]["finetune"] == "lora" and lora["recipe"]["lora_rank"] == 8
    assert qlora["device_bytes"] < lora["device_bytes"] < full["device_bytes"]
    dropped = _json(*SINGLE, "--finetune", "lora", "--lora-rank", "8", "--lora-dropout", "0.1")
    assert isinstance(dropped, dict) and dropped["recipe"]["lora_dropout"] == 0.1
    # peft's dropout keeps a dropped-out copy of each adapted linear's input.
    assert dropped["breakdown"]["activations"] > lora["breakdown"]["activations"]
    # SINGLE is pure bf16, where nothing else casts peft's fp32 adapters: compute-dtype adapters
    # keep bf16 states and no fp32 copy of each adapted linear's input.
    compute = _json(*SINGLE, "--finetune", "lora", "--lora-rank", "8", "--lora-adapter-dtype", "compute")
    assert isinstance(compute, dict) and compute["recipe"]["lora_adapter_dtype"] == "compute"
    assert lora["recipe"]["lora_adapter_dtype"] == "fp32"
    assert compute["breakdown"]["optimizer_states"] * 2 == lora["breakdown"]["optimizer_states"]
    assert compute["breakdown"]["activations"] < lora["breakdown"]["activations"]
    # QLoRA under ZeRO-3: torchao shards the NF4 block constants with the data, bitsandbytes keeps them whole.
    torchao = _json(*SINGLE, "--finetune", "qlora", "--lora-rank", "8", "--qlora-backend", "torchao")
    assert isinstance(torchao, dict) and torchao["recipe"]["qlora_backend"] == "torchao"
    assert qlora["recipe"]["qlora_backend"] == "bitsandbytes"
    assert torchao["breakdown"]["parameters"] < qlora["breakdown"]["parameters"]
    # FSDP2 (zero 3): torchtune's reshard-all holds no gathered block at the loss, torchtitan keeps the last.
    fsdp = [a if a != "bf16" else "fsdp-bf16" for a in SINGLE]
    keep, every = _json(*fsdp), _json(*fsdp, "--fsdp-reshard", "all")
    assert isinstance(keep, dict) and isinstance(every, dict) and every["recipe"]["fsdp_reshard"] == "all"
    assert keep["phase"] == every["phase"] == "forward+loss"
    assert every["peak_allocated_bytes"] < keep["peak_allocated_bytes"]
    sgd = _json(*SINGLE, "--optimizer", "sgd-momentum")
    sgd_wd = _json(*SINGLE, "--optimizer", "sgd-momentum", "--weight-decay", "0.1")
    assert isinstance(sgd, dict) and isinstance(sgd_wd, dict)
    assert sgd["recipe"]["weight_decay"] == 0.0 and sgd_wd["recipe"]["weight_decay"] == 0.1
    assert sgd_wd["peak_allocated_bytes"] >= sgd["peak_allocated_bytes"]


def test_single_layout_ep_spreads_the_experts() -> None:
    args = ["predict", "--model", MOE, "--seq-len", "2048", "--micro-batch", "1", "--dp", "8", "--zero", "1",
            "--precision", "master-bf16", "--gpu", "A100-80GB", "--json"]  # fmt: skip
    one, four = _json(*args), _json(*args, "--ep", "4")
    assert isinstance(one, dict) and isinstance(four, dict)
    assert four["layout"]["ep"] == 4 and four["recipe"]["ep"] == 4
    assert four["breakdown"]["parameters"] < one["breakdown"]["parameters"]


def test_ranked_mode_takes_the_flags() -> None:
    # bf16 + adamw: the job-spec path through the predictor; amp-bf16: MARP directly.
    for precision in ("bf16", "amp-bf16"):
        full = _json(*RANKED, "--precision", precision)
        lora = _json(*RANKED, "--precision", precision, "--finetune", "lora")
        assert isinstance(full, list) and isinstance(lora, list) and full and lora
        # Only the adapters are trained: their optimizer states are a sliver of the full model's.
        assert max(p["memory"]["optimizer_states"] for p in lora) * 10 < min(
            p["memory"]["optimizer_states"] for p in full)
        dropped = _json(*RANKED, "--precision", precision, "--finetune", "lora", "--lora-dropout", "0.1")
        assert isinstance(dropped, list) and dropped
        lora_act = {(p["gpu_type"], p["num_gpus"], str(p["layout"])): p["memory"]["activations"] for p in lora}
        same = [(p["memory"]["activations"], lora_act[k]) for p in dropped
                if (k := (p["gpu_type"], p["num_gpus"], str(p["layout"]))) in lora_act]
        assert same and all(d > a for d, a in same)
    # MARP directly (pure-bf16, fsdp-bf16): the adapters' dtype and the reshard policy reach every plan.
    fp32 = _by_layout(_json(*RANKED, "--precision", "pure-bf16", "--finetune", "lora"))
    compute = _by_layout(_json(*RANKED, "--precision", "pure-bf16", "--finetune", "lora", "--lora-adapter-dtype",
                               "compute"))  # fmt: skip
    same = [k for k in compute if k in fp32]
    assert same and all(compute[k]["optimizer_states"] < fp32[k]["optimizer_states"] for k in same)
    keep = _by_layout(_json(*RANKED, "--precision", "fsdp-bf16"))
    every = _by_layout(_json(*RANKED, "--precision", "fsdp-bf16", "--fsdp-reshard", "all"))
    fsdp = [k for k in every if k in keep and "'zero_stage': 3" in k[2]]
    assert fsdp and all(every[k]["peak_allocated"] < keep[k]["peak_allocated"] for k in fsdp)
    plans = _json("predict", "--model", MOE, "--seq-len", "2048", "--global-batch", "32", "--gpu-type", "A100-80GB",
                  "--max-gpus", "16", "--ep", "4", "--json")  # fmt: skip
    assert isinstance(plans, list) and plans and all(p["layout"]["dp"] % 4 == 0 for p in plans)


@pytest.mark.parametrize(
    ("args", "flag"),
    [(["--finetune", "dora"], "--finetune"), (["--lora-rank", "0"], "--lora-rank"),
     (["--weight-decay", "-1"], "--weight-decay"), (["--ep", "0"], "--ep"), (["--ep", "2"], "--ep"),
     (["--lora-dropout", "1"], "--lora-dropout"), (["--lora-dropout", "-0.1"], "--lora-dropout"),
     (["--lora-dropout", "nan"], "--lora-dropout"), (["--lora-adapter-dtype", "bf16"], "--lora-adapter-dtype"),
     (["--fsdp-reshard", "none"], "--fsdp-reshard"), (["--qlora-backend", "hqq"], "--qlora-backend"),
     (["--main-grad-dtype", "bf16"], "--main-grad-dtype")],
)  # fmt: skip
@pytest.mark.parametrize("mode", ["single", "ranked"])
def test_bad_values_name_the_flag(args: list[str], flag: str, mode: str) -> None:
    code, out = _run(*(SINGLE if mode == "single" else RANKED), *args)
    assert code == 2 and flag in out, out
    if flag in ("--lora-adapter-dtype", "--fsdp-reshard", "--qlora-backend"):
        assert all(c in out for c in {"--lora-adapter-dtype": ("fp32", "compute"), "--fsdp-reshard": (
            "keep-last", "all"), "--qlora-backend": ("bitsandbytes", "torchao")}[flag]), out  # the allowed values


def test_gpu_without_bf16_is_refused_by_name() -> None:
    code, out = _run("predict", "--model", "gpt2", "--seq-len", "512", "--micro-batch", "4", "--dp", "1",
                     "--precision", "amp-bf16", "--gpu", "V100-32GB", "--json")  # fmt: skip
    assert code == 2 and "--precision" in out and "V100-32GB" in out and "bf16" in out, out


def test_main_grad_dtype_half_keeps_megatrons_fp16_gradient_buffer() -> None:
    """Megatron --fp16 keeps its main-grad buffer in fp16 (2 B per parameter, not 4), in the
    single layout and in every ranked plan (fp16 is master-fp16 there, through the predictor)."""
    single = ["predict", "--model", "gpt2-355m", "--seq-len", "1024", "--micro-batch", "4", "--dp", "1", "--tp", "2",
              "--pp", "2", "--precision", "master-fp16", "--gpu", "A100-80GB", "--json"]  # fmt: skip
    fp32, half = _json(*single), _json(*single, "--main-grad-dtype", "half")
    assert isinstance(fp32, dict) and isinstance(half, dict)
    assert half["breakdown"]["gradients"] * 2 == fp32["breakdown"]["gradients"]
    code, out = _run(*SINGLE, "--main-grad-dtype", "half")  # bf16 single layout: pure bf16, no master weights
    assert code == 2 and "--main-grad-dtype" in out, out
    ranked = [*RANKED, "--precision", "fp16"]
    full, halved = _by_layout(_json(*ranked)), _by_layout(_json(*ranked, "--main-grad-dtype", "half"))
    same = [k for k in halved if k in full]
    assert same and all(halved[k]["gradients"] < full[k]["gradients"] for k in same)
