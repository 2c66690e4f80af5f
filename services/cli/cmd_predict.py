"""`frenzy predict`: the ranked plans for a job, from MARP, with no server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import marp
from frenzy.cli import render
from frenzy.cli.common import JsonOpt, echo_json, fail
from frenzy.common.jobspec import JobSpecError, parse_entry
from frenzy.v1 import types_pb2


def register(app: typer.Typer) -> None:
    app.command()(predict)


def predict(
    model: Annotated[str, typer.Option(help="Catalog name (frenzy models), a config.json path, or inline JSON.")],
    seq_len: Annotated[int, typer.Option(help="Tokens per sample.")],
    global_batch: Annotated[int, typer.Option(help="Samples per optimizer step, across all GPUs.")],
    micro_batch: Annotated[int, typer.Option(help="Samples per GPU per forward pass (0: planner chooses).")] = 0,
    precision: Annotated[str, typer.Option(help="bf16 | fp16 (mixed, fp32 master weights) | fp32.")] = "bf16",
    optimizer: Annotated[str, typer.Option(help="adamw | adam | sgd (with momentum).")] = "adamw",
    train_steps: Annotated[int, typer.Option(help="Optimizer steps (for GPU-hours).")] = 1000,
    recompute: Annotated[bool, typer.Option(help="Allow full activation recomputation.")] = True,
    flash: Annotated[bool, typer.Option(help="Flash attention (no materialised scores).")] = True,
    cluster: Annotated[Path | None, typer.Option(help="Plan for this cluster file's GPU types.")] = None,
    gpu_types: Annotated[list[str] | None, typer.Option("--gpu-type", help="Only these GPU types (repeat).")] = None,
    max_gpus: Annotated[int, typer.Option(help="At most this many GPUs (0: no limit).")] = 0,
    top: Annotated[int, typer.Option(help="Rows to show in the table.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Show the ranked plans for a job: memory per GPU under each layout, on each GPU type.

    Runs MARP locally; no server needed. Example:

        frenzy predict --model llama-2-7b --seq-len 4096 --global-batch 64 --micro-batch 1
    """
    from frenzy.common import convert
    from frenzy.predictor.server import predict as run_predict
    from frenzy.v1 import predictor_pb2

    try:
        entry = parse_entry({"model": model, "seq_len": seq_len, "global_batch": global_batch,
                             "micro_batch": micro_batch, "precision": precision, "optimizer": optimizer,
                             "train_steps": train_steps, "allow_recompute": recompute, "flash_attention": flash,
                             "command": ["-"], "max_gpus": max_gpus, "gpu_types": gpu_types or []})
        spec = entry.to_proto()
        pools = []
        if cluster is not None:
            from frenzy.local.stack import load_cluster_file

            cspec = load_cluster_file(str(cluster))
            per: dict[str, list[int]] = {}
            for g in cspec.groups:
                name = marp.get_gpu(g.gpu).name
                tot, pn = per.get(name, [0, 0])
                per[name] = [tot + g.count * g.gpus_per_node, max(pn, g.gpus_per_node)]
            pools = [types_pb2.GpuPool(gpu_type=k, total_gpus=v[0], gpus_per_node=v[1]) for k, v in per.items()]
        resp = run_predict(predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits,
                                                        pools=pools))
    except (JobSpecError, marp.MarpError, ValueError) as exc:
        fail(str(exc), 2)
    del convert
    if as_json:
        echo_json([render.to_dict(p) for p in resp.plans])
        return
    con = render.console()
    con.print(f"[bold]{resp.model_name}[/]: {resp.parameter_count / 1e9:.3f} B parameters; "
              f"seq {seq_len}, global batch {global_batch}, {precision}, {optimizer}")
    if resp.plans:
        con.print(render.plan_table(resp.plans, title=f"Ranked plans (fewest GPU-hours first; {len(resp.plans)} "
                                    "fit)", chosen=resp.plans[0], limit=top))
        con.print(render.memory_table(resp.plans[0]))
    for line in resp.rejected:
        con.print(f"[yellow]no fit[/] {line}")
    if not resp.plans:
        fail("no GPU type can hold this job. To fix: lower --micro-batch or --seq-len, allow --recompute, "
             "or plan for larger GPUs", 3)
