"""MARP's oracle: small configurations measured by ``frenzy measure`` and MARP's error on each.

The list below is what tests/integration/measure/test_measure_oracle.py checks (MARP within 5 %
of the measured tensor peak) and what docs/marp.md's "The oracle" table shows; regenerate the
table with ``.venv/bin/python -m frenzy.measure.oracle`` (needs torch, about 5 s). The models
are tiny (hidden 128-512, 2-4 layers, vocabulary <= 8k) so the whole set runs in seconds on
two cores, and they differ in everything MARP distinguishes: architecture (GPT-2, LLaMA with
MHA and GQA, BERT with an MLM or a classifier head), size, batch, sequence length, precision
policy, attention kernel, recompute, optimizer, dropout and gradient lifetime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import marp
from frenzy.measure import compare
from frenzy.measure.config import MeasureConfig, ParallelConfig


def gpt2(n_layers: int = 2, hidden: int = 256, heads: int = 4, vocab: int = 4096, tied: bool = True) -> marp.ModelSpec:
    return marp.model_from_hf_config({
        "arch": "decoder", "head": "lm", "n_layers": n_layers, "hidden": hidden, "heads": heads,
        "kv_heads": heads, "ffn": 4 * hidden, "mlp": "gelu", "vocab": vocab, "tied_embeddings": tied,
        "pos_emb": "learned", "max_positions": 1024, "norm": "layernorm", "bias": True,
        "name": f"gpt2-L{n_layers}-h{hidden}",
    })  # fmt: skip


def llama(n_layers: int = 2, hidden: int = 256, heads: int = 4, kv_heads: int = 4, ffn: int = 688,
          vocab: int = 4096, tied: bool = False) -> marp.ModelSpec:  # fmt: skip
    kind = "mha" if kv_heads == heads else f"gqa{heads // kv_heads}"
    return marp.model_from_hf_config({
        "arch": "decoder", "head": "lm", "n_layers": n_layers, "hidden": hidden, "heads": heads,
        "kv_heads": kv_heads, "ffn": ffn, "mlp": "swiglu", "vocab": vocab, "tied_embeddings": tied,
        "pos_emb": "rope", "max_positions": 4096, "norm": "rmsnorm", "bias": False,
        "name": f"llama-{kind}-L{n_layers}-h{hidden}",
    })  # fmt: skip


def bert(n_layers: int = 2, hidden: int = 256, heads: int = 4, vocab: int = 4096, head: str = "lm") -> marp.ModelSpec:
    cfg: dict[str, Any] = {
        "arch": "encoder", "head": head, "n_layers": n_layers, "hidden": hidden, "heads": heads,
        "kv_heads": heads, "ffn": 4 * hidden, "mlp": "gelu", "vocab": vocab, "tied_embeddings": True,
        "pos_emb": "learned", "max_positions": 512, "norm": "layernorm", "bias": True, "type_vocab": 2,
        "name": f"bert-{'cls' if head == 'classifier' else 'mlm'}-L{n_layers}-h{hidden}",
    }  # fmt: skip
    if head == "classifier":
        cfg["num_labels"] = 2
    return marp.model_from_hf_config(cfg)


@dataclass(frozen=True)
class OracleCase:
    """One measured configuration: a model and the ``MeasureConfig`` it is trained under."""

    model: marp.ModelSpec
    config: MeasureConfig

    @property
    def label(self) -> str:
        c = self.config
        parts = [self.model.name, f"s{c.seq_len} b{c.micro_batch}", c.precision, c.optimizer, c.attention,
                 f"recompute {c.recompute}"]  # fmt: skip
        if self.model.kv_heads != self.model.heads:
            parts.append(f"gqa {c.gqa}")
        if c.dropout:
            parts.append(f"dropout {c.dropout}")
        if c.grad_buffer != "transient":
            parts.append(f"{c.grad_buffer} grads")
        return ", ".join(parts)


def _case(model: marp.ModelSpec, seq_len: int, micro_batch: int, precision: str, **knobs: Any) -> OracleCase:
    return OracleCase(model, MeasureConfig(seq_len, micro_batch, precision, **knobs))


CASES: tuple[OracleCase, ...] = (
    _case(gpt2(), 256, 2, "pure-bf16"),
    _case(gpt2(), 256, 2, "amp-bf16", attention="eager"),
    _case(gpt2(4, 384, 6, vocab=8000, tied=False), 128, 4, "fp32", attention="eager", recompute="full"),
    _case(gpt2(), 256, 2, "pure-bf16", optimizer="sgd", attention="eager", dropout=0.1),
    _case(llama(), 256, 2, "pure-bf16"),
    _case(llama(), 256, 2, "amp-bf16", recompute="full"),
    _case(llama(3, 512, 8, 2, 1376, vocab=8000), 128, 2, "pure-bf16", attention="eager"),
    _case(llama(3, 512, 8, 2, 1376, vocab=8000), 256, 1, "fp32", optimizer="sgd", recompute="full", gqa="native"),
    _case(llama(2, 256, 8, 2, 688, vocab=1024), 256, 2, "amp-bf16", attention="eager", recompute="full"),
    _case(bert(), 128, 4, "fp32", attention="eager"),
    _case(bert(4, 128, 2, head="classifier"), 512, 2, "amp-bf16", optimizer="sgd", recompute="full"),
    _case(bert(2, 256, 4, head="classifier"), 128, 4, "fp32", attention="eager", dropout=0.1,
          grad_buffer="persistent"),
    # Issue 36: SGD with momentum in fp32 on a tied embedding, whose peak is the end of the
    # backward, where autograd sums the head's and the look-up's gradients out of place.
    _case(gpt2(4, 384, 6, vocab=8000), 128, 2, "fp32", optimizer="sgd-momentum", attention="eager", recompute="full"),
)


def run_case(case: OracleCase) -> dict[str, Any]:
    """Measure one case (needs torch) and compare it with MARP."""
    from frenzy.measure.step import measure

    measured = measure(case.model, case.config)
    predicted = compare.predict(case.model, case.config)
    out = compare.report(measured.to_dict(), predicted)
    out["label"] = case.label
    return out


def markdown_table(rows: list[dict[str, Any]]) -> str:
    mib = 2**20
    lines = ["| configuration | measured MiB | MARP MiB | error | measured phase |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['measured']['peak_allocated_bytes'] / mib:.2f} | "
                     f"{r['marp']['peak_allocated_bytes'] / mib:.2f} | {r['error_pct']:+.2f} % | "
                     f"{r['measured']['phase']} |")  # fmt: skip
    return "\n".join(lines)


ALL_LINEARS = ("q", "k", "v", "o", "gate", "up", "down")

# The multi-GPU oracle's layouts (docs/marp.md, "multi-GPU oracle"; ``python -m frenzy.measure.oracle
# --parallel``, about three minutes): the small LLaMA at seq 256 x micro-batch 2 per rank, with its
# vocabulary of 4096 (the loss's logits dominate, the peak is at the forward's end) and of 64 (the
# logits are negligible and the peak moves into the backward, where FSDP and ring attention act).
PARALLEL_CASES: tuple[tuple[int, str, dict[str, Any]], ...] = (
    (4096, "pure-bf16", {}), (4096, "pure-bf16", {"dp": 2}), (4096, "pure-bf16", {"tp": 2}),
    (4096, "pure-bf16", {"dp": 2, "tp": 2}), (4096, "pure-bf16", {"cp": 2}), (4096, "fsdp-bf16", {"dp": 2}),
    (4096, "fsdp-bf16", {"dp": 2, "cp": 2}), (4096, "fsdp-bf16", {"dp": 2, "tp": 2}),
    (4096, "fsdp-bf16", {"dp": 2, "tp": 2, "cp": 2}), (4096, "pure-bf16", {"finetune": "lora"}),
    (4096, "pure-bf16", {"dp": 2, "finetune": "lora"}), (4096, "fsdp-bf16", {"dp": 2, "finetune": "lora"}),
    (64, "pure-bf16", {}), (64, "pure-bf16", {"dp": 2}), (64, "pure-bf16", {"cp": 2}), (64, "fsdp-bf16", {"dp": 2}),
    (64, "pure-bf16", {"tp": 2}), (64, "pure-bf16", {"dp": 2, "tp": 2}), (64, "pure-bf16", {"dp": 2, "tp": 2, "cp": 2}),
    # peft's lora_dropout on every linear (the PEFT docs' runs): FSDP's bf16 compute casts the
    # adapters to bf16, as mixed precision does on a GPU.
    (4096, "fsdp-bf16", {"dp": 2, "finetune": "lora", "lora_targets": ALL_LINEARS, "lora_dropout": 0.1}),
    # Four layers under full recompute: the saved tensors are small, so the backward's peak moves
    # below the top layer, beside the previous unit's reduce-scatter input.
    (64, "fsdp-bf16", {"dp": 2, "n_layers": 4, "recompute": "full"}),
    (64, "pure-bf16", {"dp": 2, "n_layers": 4, "recompute": "full"}),
    # LoRA on every linear in pure bf16: peft's fp32 adapters cast each input to fp32 (no
    # mixed-precision wrapper casts them), a copy per adapted linear.
    (4096, "pure-bf16", {"finetune": "lora", "lora_targets": ALL_LINEARS}),
    (64, "pure-bf16", {"finetune": "lora", "lora_targets": ALL_LINEARS}),
    # torchtune's reshard policy: every block reshards after its forward (none gathered at the loss).
    (4096, "fsdp-bf16", {"dp": 2, "fsdp_reshard": "all"}),
)  # fmt: skip


def parallel_case(vocab: int, precision: str,
                  knobs: dict[str, Any]) -> tuple[marp.ModelSpec, MeasureConfig, ParallelConfig]:  # fmt: skip
    """One PARALLEL_CASES entry as (model, MeasureConfig, ParallelConfig): ``n_layers`` sizes the
    model, ``recompute`` goes to the step, the other knobs to the layout."""
    layout = {k: v for k, v in knobs.items() if k not in ("n_layers", "recompute")}
    config = MeasureConfig(256, 2, precision, recompute=knobs.get("recompute", "none"))
    return llama(n_layers=knobs.get("n_layers", 2), vocab=vocab), config, ParallelConfig(**layout)


def parallel_table() -> str:
    """Measure PARALLEL_CASES (needs torch and peft) and render them as docs/marp.md's table."""
    from frenzy.measure.parallel import measure_layout

    mib = 2**20
    lines = ["| vocab | layout | precision | rank (dp,cp,tp) | measured MiB | MARP MiB | error | measured phase | "
             "MARP phase |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for vocab, precision, knobs in PARALLEL_CASES:
        spec, config, par = parallel_case(vocab, precision, knobs)
        out = compare.report_parallel(measure_layout(spec, config, par), compare.predict_parallel(spec, config, par))
        name = f"dp{par.dp} x tp{par.tp} x cp{par.cp}"
        if spec.n_layers != 2 or config.recompute != "none":
            name += f" L{spec.n_layers} recompute {config.recompute}"
        if par.finetune == "lora":
            name += f" LoRA r{par.lora_rank} {','.join(par.lora_targets)}"
            name += f" dropout {par.lora_dropout}" if par.lora_dropout else ""
        if par.fsdp_reshard != "keep-last":
            name += f" reshard {par.fsdp_reshard}"
        for r in out["ranks"]:
            c = r["coords"]
            lines.append(f"| {vocab} | {name} | {precision} | {r['rank']} ({c['dp']},{c['cp']},{c['tp']}) | "
                         f"{r['peak_bytes'] / mib:.2f} | {r['marp_peak_bytes'] / mib:.2f} | {r['error_pct']:+.2f} % | "
                         f"{r['phase']} | {out['marp']['phase']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    import sys

    if "--parallel" in sys.argv[1:]:
        print(parallel_table())
        return
    rows = [run_case(c) for c in CASES]
    print(markdown_table(rows))
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    mean = sum(abs(r["error_pct"]) for r in rows) / len(rows)
    print(json.dumps({"cases": len(rows), "mean_abs_error_pct": round(mean, 2), "worst": worst["label"],
                      "worst_error_pct": worst["error_pct"]}))  # fmt: skip


if __name__ == "__main__":
    main()
