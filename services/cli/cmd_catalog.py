"""``frenzy models`` and ``frenzy gpus``: the catalogs MARP plans over, as tables or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, echo_json, fail

PANEL = "Plan a job"


def models(as_json: JsonOpt = False) -> None:
    """List the model catalog (names usable with --model)."""
    import marp

    rows = []
    for m in marp.list_models():
        rows.append({"name": m.name, "family": m.family, "parameters": m.param_count(), "layers": m.n_layers,
                     "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "ffn": m.ffn, "mlp": m.mlp,
                     "vocab": m.vocab, "tied_embeddings": m.tied_embeddings})
    if as_json:
        echo_json(rows)
        return
    from rich.table import Table

    t = Table(title="Model catalog", title_justify="left")
    for col in ("NAME", "FAMILY", "PARAMS", "LAYERS", "HIDDEN", "HEADS", "KV", "FFN", "MLP", "VOCAB"):
        t.add_column(col, justify="left" if col in ("NAME", "FAMILY", "MLP") else "right")
    for r in rows:
        t.add_row(r["name"], r["family"], f"{r['parameters'] / 1e9:.2f} B", str(r["layers"]), str(r["hidden"]),
                  str(r["heads"]), str(r["kv_heads"]), str(r["ffn"]), r["mlp"], str(r["vocab"]))
    render.console().print(t)


def gpus(
    cluster: Annotated[Path | None, typer.Option(help="Show this cluster file's price_per_gpu_hour where it sets "
                                                 "one (the operator's rate over the list price).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the GPU catalog (types usable in cluster files and --gpu-types), with a price per GPU-hour.

    Prices are on-demand list prices (source and date: docs/cost.md); a cluster file's
    price_per_gpu_hour per node group overrides them for `frenzy predict --objective cost`.
    """
    import marp

    own: dict[str, float] = {}
    if cluster is not None:
        from frenzy.devstack.stack import load_cluster_file

        try:
            own = {marp.get_gpu(t).name: v for t, v in load_cluster_file(str(cluster)).price_overrides().items()}
        except (marp.MarpError, ValueError) as exc:
            fail(f"--cluster: {exc}", 2)
    rows = [{"name": g.name, "memory_gib": round(g.memory_bytes / render.GiB, 1), "bf16_tflops": g.bf16_tflops,
             "fp16_tflops": g.fp16_tflops, "mem_bw_gbps": g.mem_bw_gbps, "intra_node_link": g.intra_node_link,
             "intra_node_gbps": g.intra_node_gbps, "price_per_gpu_hour": own.get(g.name, g.price_per_gpu_hour),
             "list_price_per_gpu_hour": g.price_per_gpu_hour,
             "price_source": "cluster file" if g.name in own else "list"} for g in marp.list_gpus()]  # fmt: skip
    if as_json:
        echo_json(rows)
        return
    from rich.table import Table

    t = Table(title="GPU catalog", title_justify="left")
    for col in ("NAME", "MEMORY GiB", "BF16 TFLOPS", "FP16 TFLOPS", "MEM BW GB/s", "LINK", "LINK GB/s", "$/GPU-h"):
        t.add_column(col, justify="left" if col in ("NAME", "LINK") else "right")
    for r in rows:
        price = render.money(r["price_per_gpu_hour"]) if r["price_per_gpu_hour"] else "$0.00"
        t.add_row(r["name"], str(r["memory_gib"]), str(r["bf16_tflops"]), str(r["fp16_tflops"]),
                  str(r["mem_bw_gbps"]), r["intra_node_link"], str(r["intra_node_gbps"]),
                  price + (" (cluster)" if r["price_source"] == "cluster file" else ""))
    render.console().print(t)


# ---- jobs ----------------------------------------------------------------------------------------


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel=PANEL)(models)
    app.command(rich_help_panel=PANEL)(gpus)
