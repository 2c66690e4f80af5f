"""`frenzy measure`'s input errors and the torch-missing path: exit 2 with a message naming the flag
(or the install command), before any measurement starts. No torch needed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from frenzy.cli import cmd_measure
from frenzy.cli.main import app

RUN = CliRunner()
BASE = {"--model": "gpt2", "--seq-len": "128", "--micro-batch": "1", "--precision": "bf16", "--optimizer": "adamw"}


def _args(**over: str) -> list[str]:
    opts = {**BASE, **{"--" + k.replace("_", "-"): v for k, v in over.items()}}
    return ["measure", *(x for kv in opts.items() for x in kv)]


def test_missing_torch_exits_2_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cmd_measure, "torch_available", lambda: False)
    res = RUN.invoke(app, _args())
    assert res.exit_code == 2
    assert "pip install -e .[train]" in res.output


@pytest.mark.parametrize(("over", "named"), [
    ({"precision": "fp16"}, "--precision"), ({"optimizer": "lion"}, "--optimizer"),
    ({"attention": "sdpa"}, "--attention"), ({"recompute": "selective"}, "--recompute"), ({"gqa": "mqa"}, "--gqa"),
    ({"dropout": "1.5"}, "--dropout"), ({"grad_buffer": "kept"}, "--grad-buffer"),
    ({"optimizer_impl": "fused"}, "--optimizer-impl"), ({"seq_len": "0"}, "--seq-len"),
    ({"seq_len": "4096"}, "--seq-len"),  # GPT-2 has 1024 learned positions
    ({"micro_batch": "0"}, "--micro-batch"), ({"model": "no-such-model"}, "--model"),
])  # fmt: skip
def test_bad_flags_exit_2_naming_the_flag(over: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cmd_measure, "torch_available", lambda: pytest.fail("checked inputs after torch"))
    res = RUN.invoke(app, _args(**over))
    assert res.exit_code == 2, res.output
    assert named in res.output


LLAMA = ('{"arch":"decoder","head":"lm","n_layers":2,"hidden":256,"heads":4,"kv_heads":4,"ffn":688,"mlp":"swiglu",'
         '"vocab":4096,"tied_embeddings":false,"pos_emb":"rope","max_positions":4096,"norm":"rmsnorm","bias":false}')


@pytest.mark.parametrize(("over", "named"), [
    ({"dp": "0"}, "--dp"), ({"tp": "-1"}, "--tp"), ({"finetune": "qlora"}, "--finetune"),
    ({"finetune": "lora", "lora_targets": "q,proj"}, "--lora-targets"),
    ({"finetune": "lora", "lora_dropout": "1.5"}, "--lora-dropout"),
    ({"tp": "3"}, "tp 3 must divide heads"),  # 4 heads
    ({"cp": "2", "attention": "eager"}, "ring attention"),
    ({"precision": "fsdp-bf16"}, "needs dp x cp > 1"),
    ({"tp": "2", "precision": "amp-bf16"}, "does not emulate autocast"),
    ({"tp": "2", "finetune": "lora"}, "LoRA with tp > 1"),
    ({"model": "gpt2", "dp": "2"}, "LLaMA-style"),
    ({"finetune": "lora", "lora_adapter_dtype": "bf16"}, "--lora-adapter-dtype"),
    ({"lora_adapter_dtype": "compute"}, "no adapters without --finetune lora"),
    ({"dp": "2", "fsdp_reshard": "none"}, "--fsdp-reshard"),
    ({"fsdp_reshard": "all"}, "no FSDP to reshard"),  # one GPU
    ({"tp": "2", "fsdp_reshard": "all"}, "no FSDP to reshard"),  # dp x cp = 1
    ({"finetune": "lora", "qlora_backend": "nf8"}, "bitsandbytes, torchao"),
    ({"finetune": "lora", "qlora_backend": "torchao"}, "cannot build QLoRA"),
    ({"qlora_backend": "bitsandbytes"}, "cannot build QLoRA"),
])  # fmt: skip
def test_bad_layout_flags_exit_2_before_torch(over: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cmd_measure, "torch_available", lambda: pytest.fail("checked inputs after torch"))
    res = RUN.invoke(app, _args(**{"model": LLAMA, **over}))
    assert res.exit_code == 2, res.output
    assert named in res.output.replace("\n", " ")


def test_lora_without_peft_exits_2_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cmd_measure, "torch_available", lambda: True)
    monkeypatch.setattr(cmd_measure, "peft_available", lambda: False)
    res = RUN.invoke(app, _args(model=LLAMA, finetune="lora"))
    assert res.exit_code == 2, res.output
    assert "needs peft" in res.output and "pip install -e .[train]" in res.output


def test_recipe_flags_reach_the_oracle_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # --lora-adapter-dtype and --fsdp-reshard are the oracle's (ParallelConfig) as frenzy predict's
    # are MARP's; the measurement itself is stubbed (torch-free).
    seen: list[object] = []
    monkeypatch.setattr(cmd_measure, "torch_available", lambda: True)
    monkeypatch.setattr(cmd_measure, "peft_available", lambda: True)
    monkeypatch.setattr(cmd_measure, "_measure_parallel", lambda spec, configs, *a, **k: seen.append(configs[1]))
    res = RUN.invoke(app, _args(model=LLAMA, precision="fsdp-bf16", dp="2", finetune="lora",
                                lora_adapter_dtype="compute", fsdp_reshard="all"))  # fmt: skip
    assert res.exit_code == 0, res.output
    (par,) = seen
    assert (par.lora_adapter_dtype, par.fsdp_reshard, par.dp) == ("compute", "all", 2)
    defaults = RUN.invoke(app, _args(model=LLAMA, finetune="lora"))
    assert defaults.exit_code == 0, defaults.output
    assert (seen[1].lora_adapter_dtype, seen[1].fsdp_reshard) == ("fp32", "keep-last")
