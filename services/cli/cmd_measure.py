"""`frenzy measure`: one training step on fake tensors, its peak tensor bytes beside MARP's prediction.

Runs locally, no server, no GPU: torch (the ``train`` extra) builds the model without weights,
trains two iterations on fake CPU tensors with CUDA's behaviour emulated, and reports the second
one's peak of live tensor bytes (what ``torch.cuda.max_memory_allocated`` would show on one GPU)
with its breakdown, next to ``marp.predict_memory`` for the same single-GPU layout and the error.
torch is imported only when the command runs, so ``frenzy`` itself starts without it.
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

import marp
from frenzy.cli import render
from frenzy.cli.output import JsonOpt, echo_json, fail
from frenzy.measure import INSTALL_HINT, compare, torch_available
from frenzy.measure.config import (
    ATTENTIONS,
    GQA_MODES,
    GRAD_BUFFERS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    RECOMPUTES,
    MeasureConfig,
)

# Precisions as spelled on the command line (``bf16`` is pure bf16); the other choices are the config's.
PRECISIONS = tuple(compare.PRECISIONS)


def register(app: typer.Typer) -> None:
    app.command()(measure)


def _fail(message: str) -> NoReturn:
    fail(escape(message), 2)  # rich would read "[train]" as markup


def _choice(value: str, flag: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        _fail(f"{flag}: must be one of {', '.join(choices)}, got {value!r}.")
    return value


def measure(
    model: Annotated[str, typer.Option(help="Catalog name (frenzy models), a config.json path, or inline JSON "
                                       "(HF config or Frenzy's neutral spec).")],
    seq_len: Annotated[int, typer.Option(help="Tokens per sample.")],
    micro_batch: Annotated[int, typer.Option(help="Samples per step (one GPU, one micro-batch).")],
    precision: Annotated[str, typer.Option(help="fp32 | bf16 (= pure-bf16: everything in bf16) | amp-bf16 "
                                           "(torch autocast: fp32 parameters, bf16 matmuls).")],
    optimizer: Annotated[str, typer.Option(help="adamw | adam | sgd | sgd-momentum (torch.optim defaults).")],
    attention: Annotated[str, typer.Option(help="flash (SDPA, no s x s scores) | eager (materialised scores "
                                           "and softmax).")] = "flash",
    recompute: Annotated[str, typer.Option(help="none | full (torch.utils.checkpoint on every layer).")] = "none",
    gqa: Annotated[str, typer.Option(help="Grouped-query K/V: repeat (repeat_kv to every head, torchtitan / "
                                     "torchtune / HF eager) | native (SDPA enable_gqa).")] = "repeat",
    dropout: Annotated[float, typer.Option(help="Dropout probability (GPT-2 / BERT placements).")] = 0.0,
    grad_buffer: Annotated[str, typer.Option(help="transient (zero_grad frees gradients, PyTorch >= 2.0) | "
                                             "persistent (zeroed in place).")] = "transient",
    optimizer_impl: Annotated[str, typer.Option(help="foreach (the CUDA default) | forloop.")] = "foreach",
    as_json: JsonOpt = False,
) -> None:
    """Measure one training step's peak tensor memory on fake tensors and compare it with MARP.

    Single GPU (dp = tp = pp = 1). Needs PyTorch: pip install -e .[train]. Example:

        frenzy measure --model llama-3.2-1b --seq-len 2048 --micro-batch 1 --precision bf16 --optimizer adamw
    """
    _choice(precision, "--precision", PRECISIONS)
    _choice(optimizer, "--optimizer", OPTIMIZERS)
    _choice(attention, "--attention", ATTENTIONS)
    _choice(recompute, "--recompute", RECOMPUTES)
    _choice(gqa, "--gqa", GQA_MODES)
    _choice(grad_buffer, "--grad-buffer", GRAD_BUFFERS)
    _choice(optimizer_impl, "--optimizer-impl", OPTIMIZER_IMPLS)
    if seq_len < 1:
        _fail(f"--seq-len: must be a positive number of tokens, got {seq_len}.")
    if micro_batch < 1:
        _fail(f"--micro-batch: must be a positive number of samples, got {micro_batch}.")
    if not 0.0 <= dropout < 1.0:
        _fail(f"--dropout: must be a probability in [0, 1), got {dropout}.")
    policy = compare.PRECISIONS[precision]
    try:
        spec = marp.resolve_model(model)
    except marp.MarpError as exc:
        _fail(f"--model: {exc}")
    if spec.experts:
        _fail(f"--model: {spec.name} is a mixture-of-experts model; frenzy measure builds dense models only.")
    if spec.pos_emb == "learned" and seq_len > spec.max_positions:
        _fail(f"--seq-len: {seq_len} exceeds {spec.name}'s {spec.max_positions} learned positions.")
    if not torch_available():
        _fail(f"frenzy measure needs PyTorch, which is not installed. To fix: {INSTALL_HINT}")

    from frenzy.measure.step import measure as run

    try:
        config = MeasureConfig(seq_len=seq_len, micro_batch=micro_batch, precision=policy, optimizer=optimizer,
                               attention=attention, recompute=recompute, gqa=gqa, dropout=dropout,
                               grad_buffer=grad_buffer, optimizer_impl=optimizer_impl)  # fmt: skip
        # One traced step of a real model on fake tensors takes seconds to minutes (a 7B model's
        # graph is large): say what is happening, on stderr, not in the JSON on stdout.
        with render.console(stderr=True).status(f"measuring one training step of {spec.name} on fake tensors "
                                                f"(seq {seq_len}, micro-batch {micro_batch}, {precision})..."):
            measured = run(spec, config)
            predicted = compare.predict(spec, config)
    except (ValueError, marp.MarpError) as exc:
        _fail(str(exc))
    out = compare.report(measured.to_dict(), predicted)
    if as_json:
        echo_json(out)
        return
    _print(out)


def _print(out: dict[str, Any]) -> None:
    from rich.table import Table

    mib = 2**20
    m, p = out["measured"], out["marp"]
    cfg = out["config"]
    title = (f"{out['model']}: seq {cfg['seq_len']} x batch {cfg['micro_batch']}, {cfg['precision']}, "
             f"{cfg['optimizer']}, {cfg['attention']} attention, recompute {cfg['recompute']}")  # fmt: skip
    table = Table()
    for col in ("MiB", "measured", "MARP"):
        table.add_column(col, justify="left" if col == "MiB" else "right")
    for key in ("parameters", "gradients", "optimizer_states", "other"):
        table.add_row(key.replace("_", " "), f"{m['breakdown'][key] / mib:.2f}", f"{p['breakdown'][key] / mib:.2f}")
    table.add_row("[bold]peak allocated[/]", f"[bold]{m['peak_allocated_bytes'] / mib:.2f}[/]",
                  f"[bold]{p['peak_allocated_bytes'] / mib:.2f}[/]")  # fmt: skip
    table.add_row("phase", m["phase"], p["phase"])
    console = render.console()
    console.print(title)
    console.print(table)
    console.print(f"MARP error: [bold]{out['error_pct']:+.2f} %[/] of the measured peak "
                  f"({m['param_count']:,} parameters, measured in {m['seconds']:.1f} s)")  # fmt: skip
    for note in out.get("notes", []):
        console.print(f"note: {note}")
