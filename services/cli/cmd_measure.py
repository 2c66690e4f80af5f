"""`frenzy measure`: one training step on fake tensors, its peak tensor bytes beside MARP's prediction.

Runs locally, no server, no GPU: torch (the ``train`` extra) builds the model without weights,
trains two iterations on fake CPU tensors with CUDA's behaviour emulated, and reports the second
one's peak of live tensor bytes (what ``torch.cuda.max_memory_allocated`` would show on one GPU)
with its breakdown, next to ``marp.predict_memory`` for the same single-GPU layout and the error.
torch is imported only when the command runs, so ``frenzy`` itself starts without it.
On a terminal's stderr a spinner (one GPU) or a bar of the layout's ranks (``--dp/--tp/--cp``, one
subprocess each, from ``measure_layout``'s progress callback) shows the work; ``--no-progress`` or a
redirected stderr draws nothing, and stdout (the table or ``--json``) is the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

import marp
from frenzy.cli import render
from frenzy.cli.output import JsonOpt, echo_json, fail
from frenzy.cli.progress import NoProgressOpt, rank_bar, wanted
from frenzy.measure import INSTALL_HINT, compare, peft_available, torch_available
from frenzy.measure.config import (
    ATTENTIONS,
    FINETUNES,
    GQA_MODES,
    GRAD_BUFFERS,
    LORA_TARGETS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    RECOMPUTES,
    MeasureConfig,
    ParallelConfig,
    check_parallel,
)
from marp.choices import FSDP_RESHARDS, LORA_ADAPTER_DTYPES, QLORA_BACKENDS

# Precisions as spelled on the command line (``bf16`` is pure bf16); the other choices are the config's.
PRECISIONS = tuple(compare.PRECISIONS)


PANEL = "Plan a job"


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel=PANEL)(measure)


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
                                           "(torch autocast: fp32 parameters, bf16 matmuls) | fsdp-bf16 (FSDP2 mixed precision: fp32 "
                                           "shards, bf16 compute; needs --dp or --cp > 1).")],
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
    dp: Annotated[int, typer.Option(help="Data-parallel ranks (FSDP2 shards over dp x cp).")] = 1,
    tp: Annotated[int, typer.Option(help="Tensor-parallel ranks (DTensor, with sequence parallelism and "
                                    "loss parallel, torchtitan's plan).")] = 1,
    cp: Annotated[int, typer.Option(help="Context-parallel ranks (ring attention; flash attention).")] = 1,
    finetune: Annotated[str, typer.Option(help="full | lora (peft adapters on a frozen base).")] = "full",
    lora_rank: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    lora_targets: Annotated[str, typer.Option(help="LoRA target matrices, comma-separated: "
                                              "q,k,v,o,gate,up,down.")] = "q,k,v,o",
    lora_dropout: Annotated[float, typer.Option(help="peft's lora_dropout on the adapters' inputs.")] = 0.0,
    lora_adapter_dtype: Annotated[str, typer.Option(help="fp32 | compute: the adapters' dtype; peft upcasts them "
                                                    "to fp32 (default), compute keeps the base's (bf16 under "
                                                    "--precision bf16).")] = "fp32",
    fsdp_reshard: Annotated[str, typer.Option(help="keep-last | all: FSDP2 blocks resharded after their forward; "
                                              "torchtitan keeps the last gathered (default), torchtune reshards "
                                              "all.")] = "keep-last",
    qlora_backend: Annotated[str | None, typer.Option(help="bitsandbytes | torchao: QLoRA's NF4 base, as in frenzy "
                                                      "predict; the oracle builds no QLoRA (no NF4 kernels on fake "
                                                      "tensors), so any value is refused.")] = None,
    all_ranks: Annotated[bool, typer.Option("--all-ranks", help="Simulate every rank, not one per cp "
                                            "coordinate (dp and tp ranks are symmetric).")] = False,
    as_json: JsonOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    """Measure one training step's peak tensor memory on fake tensors and compare it with MARP.

    One GPU by default; --dp / --tp / --cp (or --finetune lora) measure each rank of a multi-GPU layout
    on PyTorch's fake process group (FSDP2, DTensor TP, ring-attention CP; LLaMA-style models). Needs
    PyTorch: pip install -e .[train]. Examples:

        frenzy measure --model llama-3.2-1b --seq-len 2048 --micro-batch 1 --precision bf16 --optimizer adamw

        frenzy measure --model M --seq-len 256 --micro-batch 2 --precision fsdp-bf16 --optimizer adamw --dp 2 --tp 2
    """
    _choice(precision, "--precision", PRECISIONS)
    _choice(optimizer, "--optimizer", OPTIMIZERS)
    _choice(attention, "--attention", ATTENTIONS)
    _choice(recompute, "--recompute", RECOMPUTES)
    _choice(gqa, "--gqa", GQA_MODES)
    _choice(grad_buffer, "--grad-buffer", GRAD_BUFFERS)
    _choice(optimizer_impl, "--optimizer-impl", OPTIMIZER_IMPLS)
    _choice(lora_adapter_dtype, "--lora-adapter-dtype", LORA_ADAPTER_DTYPES)
    _choice(fsdp_reshard, "--fsdp-reshard", FSDP_RESHARDS)
    if qlora_backend is not None:
        _choice(qlora_backend, "--qlora-backend", QLORA_BACKENDS)
        _fail("--qlora-backend: frenzy measure cannot build QLoRA (neither bitsandbytes' nor torchao's NF4 runs "
              "on fake tensors); measure --finetune lora, or predict QLoRA with frenzy predict --finetune qlora "
              f"--qlora-backend {qlora_backend}.")
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
    parallel = (dp, tp, cp) != (1, 1, 1) or finetune != "full" or policy == "fsdp-bf16"
    if not parallel and fsdp_reshard != "keep-last":
        _fail("--fsdp-reshard: there is no FSDP to reshard on one GPU; give --dp or --cp > 1.")
    if finetune == "full" and lora_adapter_dtype != "fp32":
        _fail("--lora-adapter-dtype: there are no adapters without --finetune lora.")
    if parallel:
        par = _parallel_config(spec, seq_len, micro_batch, policy, optimizer, attention, recompute, gqa, dropout,
                               grad_buffer, optimizer_impl, dp, tp, cp, finetune, lora_rank, lora_targets,
                               lora_dropout, fsdp_reshard, lora_adapter_dtype)  # fmt: skip
    if not torch_available():
        _fail(f"frenzy measure needs PyTorch, which is not installed. To fix: {INSTALL_HINT}")
    if finetune == "lora" and not peft_available():
        _fail(f"frenzy measure --finetune lora needs peft, which is not installed. To fix: {INSTALL_HINT}")
    if parallel:
        _measure_parallel(spec, par, all_ranks, as_json, wanted(no_progress))
        return

    from frenzy.measure.step import measure as run

    try:
        config = MeasureConfig(seq_len=seq_len, micro_batch=micro_batch, precision=policy, optimizer=optimizer,
                               attention=attention, recompute=recompute, gqa=gqa, dropout=dropout,
                               grad_buffer=grad_buffer, optimizer_impl=optimizer_impl)  # fmt: skip
        # One traced step of a real model on fake tensors takes seconds to minutes (a 7B model's
        # graph is large): say what is happening, on stderr, not in the JSON on stdout.
        with _spinner(f"measuring one training step of {spec.name} on fake tensors (seq {seq_len}, "
                      f"micro-batch {micro_batch}, {precision})...", wanted(no_progress)):  # fmt: skip
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


def _parallel_config(spec: marp.ModelSpec, seq_len: int, micro_batch: int, policy: str, optimizer: str,
                     attention: str, recompute: str, gqa: str, dropout: float, grad_buffer: str,
                     optimizer_impl: str, dp: int, tp: int, cp: int, finetune: str, lora_rank: int,
                     lora_targets: str, lora_dropout: float = 0.0, fsdp_reshard: str = "keep-last",
                     lora_adapter_dtype: str = "fp32") -> tuple[MeasureConfig, ParallelConfig]:  # fmt: skip
    """The checked configs of a multi-GPU measurement (exit 2 naming the flag otherwise), before torch."""
    for flag, value in (("--dp", dp), ("--tp", tp), ("--cp", cp), ("--lora-rank", lora_rank)):
        if value < 1:
            _fail(f"{flag}: must be a positive integer, got {value}.")
    _choice(finetune, "--finetune", FINETUNES)
    targets = tuple(t.strip() for t in lora_targets.split(",") if t.strip())
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad or not targets:
        _fail(f"--lora-targets: must be among {','.join(LORA_TARGETS)}, got {lora_targets!r}.")
    config = MeasureConfig(seq_len=seq_len, micro_batch=micro_batch, precision=policy, optimizer=optimizer,
                           attention=attention, recompute=recompute, gqa=gqa, dropout=dropout,
                           grad_buffer=grad_buffer, optimizer_impl=optimizer_impl)  # fmt: skip
    if not 0.0 <= lora_dropout < 1.0:
        _fail(f"--lora-dropout: must be a probability in [0, 1), got {lora_dropout}.")
    if fsdp_reshard != "keep-last" and dp * cp == 1:
        _fail("--fsdp-reshard: there is no FSDP to reshard at dp x cp = 1; give --dp or --cp > 1.")
    par = ParallelConfig(dp=dp, tp=tp, cp=cp, finetune=finetune, lora_rank=lora_rank, lora_targets=targets,
                         lora_dropout=lora_dropout, fsdp_reshard=fsdp_reshard,
                         lora_adapter_dtype=lora_adapter_dtype)  # fmt: skip
    try:
        check_parallel(spec, config, par)
    except ValueError as exc:
        _fail(f"--dp/--tp/--cp/--finetune: {exc}. To fix: change the layout or the flag it names.")
    return config, par


@contextmanager
def _spinner(message: str, show: bool) -> Iterator[None]:
    """A spinner with ``message`` on stderr while the block runs, when ``show``."""
    with render.console(stderr=True).status(message) if show else nullcontext():
        yield


def _measure_parallel(spec: marp.ModelSpec, configs: tuple[MeasureConfig, ParallelConfig], all_ranks: bool,
                      as_json: bool, show_progress: bool = False) -> None:  # fmt: skip
    from frenzy.measure.parallel import measure_layout

    config, par = configs
    ranks = list(range(par.world_size)) if all_ranks else None
    layout = f"dp {par.dp} x tp {par.tp} x cp {par.cp}"
    try:
        if not show_progress:
            measured = measure_layout(spec, config, par, ranks)
        else:
            from frenzy.measure.parallel import distinct_ranks

            # Each rank is a subprocess that builds and traces the model: seconds to minutes each.
            with rank_bar(f"{spec.name} ({layout})", len(ranks or distinct_ranks(par))) as bar:

                def heard(done: int, total: int, rank: int | None) -> None:
                    now = "done" if rank is None else f"rank {rank} ({_coords(par, rank)})"
                    bar.update(bar.task_ids[0], completed=done, total=total,
                               description=f"{spec.name} ({layout}): {now}")  # fmt: skip

                measured = measure_layout(spec, config, par, ranks, progress=heard)
        predicted = compare.predict_parallel(spec, config, par)
    except (ValueError, marp.MarpError) as exc:
        _fail(str(exc))
    out = compare.report_parallel(measured, predicted)
    if as_json:
        echo_json(out)
        return
    _print_parallel(out)


def _coords(par: ParallelConfig, rank: int) -> str:
    c = par.rank_coords(rank)
    return f"dp {c['dp']}, cp {c['cp']}, tp {c['tp']}"


def _print_parallel(out: dict[str, Any]) -> None:
    from rich.table import Table

    mib = 2**20
    cfg, par = out["config"], out["parallel"]
    title = (f"{out['model']}: dp {par['dp']} x tp {par['tp']} x cp {par['cp']} ({par['world_size']} rank{'s' if par['world_size'] > 1 else ''}), "
             f"seq {cfg['seq_len']} x batch {cfg['micro_batch']} per rank, {cfg['precision']}, {cfg['optimizer']}, "
             f"recompute {cfg['recompute']}, finetune {par['finetune']}"
             + (f" ({par['lora_adapter_dtype']} adapters)" if par["finetune"] != "full" else "")
             + (f", fsdp reshard {par['fsdp_reshard']}" if par["dp"] * par["cp"] > 1 else ""))  # fmt: skip
    table = Table()
    for col in ("rank", "dp,cp,tp", "peak MiB", "params", "grads", "optimizer", "other", "phase", "MARP MiB",
                "error"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("rank", "dp,cp,tp", "phase") else "right")
    for r in out["ranks"]:
        b, c = r["breakdown"], r["coords"]
        table.add_row(str(r["rank"]), f"{c['dp']},{c['cp']},{c['tp']}", f"{r['peak_bytes'] / mib:.2f}",
                      f"{b['parameters'] / mib:.2f}", f"{b['gradients'] / mib:.2f}",
                      f"{b['optimizer_states'] / mib:.2f}", f"{b['other'] / mib:.2f}", r["phase"],
                      f"{r['marp_peak_bytes'] / mib:.2f}", f"{r['error_pct']:+.2f} %")  # fmt: skip
    console = render.console()
    console.print(title)
    console.print(table)
    m = out["marp"]
    console.print(f"MARP: {m['peak_allocated_bytes'] / mib:.2f} MiB in {m['phase']} (params "
                  f"{m['breakdown']['parameters'] / mib:.2f}, grads {m['breakdown']['gradients'] / mib:.2f}, "
                  f"optimizer {m['breakdown']['optimizer_states'] / mib:.2f}, other "
                  f"{m['breakdown']['other'] / mib:.2f})")  # fmt: skip
    if out["symmetric_to"]:
        same = ", ".join(f"{k}={v}" for k, v in out["symmetric_to"].items())
        console.print(f"not simulated (same memory as the rank after '='): {same}")
    for note in out.get("notes", []):
        console.print(f"note: {note}")
