"""What `frenzy simulate` shows and writes: the JSON, the tables, and the files under --out.

The run itself is in ``frenzy.cli.cmd_simulate``; the markdown table and the plots are drawn
by ``has.sim.report``. The JSON keys are what automation reads: keep them stable.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from frenzy.cli import render

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from frenzy.cli.cmd_simulate import SimInputs, SimOutcome, SimSettings


def show(settings: SimSettings, inputs: SimInputs, outcome: SimOutcome) -> None:
    """Write the --out files, then print the JSON (--json) or the tables."""
    data = payload(settings, inputs, outcome)
    heading = title(settings, inputs)
    if settings.out is not None:
        write_files(settings.out, settings, outcome, data, heading)
    if settings.as_json:
        import typer

        typer.echo(json.dumps(data))
        return
    con = render.console()
    print_metrics(con, outcome, heading)
    if outcome.scale:
        print_decision_vs_size(con, settings, outcome)
    if settings.out is not None:
        plots = "jct_cdf.png, utilization.png, decision_ms.png" + (
            ", decision_vs_size.png" if outcome.scale else ""
        )
        con.print(f"results in {settings.out}/ (results.json, summary.md, {plots})")


def payload(settings: SimSettings, inputs: SimInputs, outcome: SimOutcome) -> dict[str, Any]:
    """The results as JSON: per-policy metrics, what ran on what, and decision_vs_size when timed."""
    trace = str(settings.trace) if settings.trace else f"synthetic:{settings.synthetic}:seed={settings.seed}"
    data: dict[str, Any] = {
        "policies": outcome.metrics,
        "cluster": {"file": str(settings.cluster), "gpus": inputs.spec.total_gpus},
        "trace": {"file": trace, "jobs": len(inputs.jobs)},
        "restart_s": settings.restart_s,
        # down_s null: down for the rest of the run
        "node_failures": [
            {"node": n, "at_s": at, "down_s": None if down == float("inf") else down}
            for at, n, down in inputs.failures
        ],
    }
    if outcome.scale:
        data["decision_vs_size"] = outcome.scale
    return data


def title(settings: SimSettings, inputs: SimInputs) -> str:
    source = settings.trace or f"synthetic (seed {settings.seed})"
    return f"{len(inputs.jobs)} jobs from {source} on {settings.cluster} ({inputs.spec.total_gpus} GPUs)"


def write_files(
    out: Path, settings: SimSettings, outcome: SimOutcome, data: dict[str, Any], heading: str
) -> None:
    """results.json, summary.md and the plots in ``out`` (--out; created if missing)."""
    from has.sim.report import markdown_table, plot_decision_vs_size, write_plots

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "summary.md").write_text(markdown_table(outcome.metrics, f"**{heading}**"))
    write_plots(outcome.results, out)
    if outcome.scale:
        plot_decision_vs_size(outcome.scale, out / "decision_vs_size.png", queued=settings.decision_queue)


def print_metrics(con: Console, outcome: SimOutcome, heading: str) -> None:
    """One row per policy, then the markdown summary's comparison lines."""
    from rich.table import Table

    from has.sim.report import COLUMNS, markdown_table

    table = Table(title=heading)
    table.add_column("policy")
    for _, head, _ in COLUMNS:
        table.add_column(head, justify="right")
    for name, m in outcome.metrics.items():
        table.add_row(name, *(_cell(m[k], s) for k, _, s in COLUMNS))
    con.print(table)
    tail = markdown_table(outcome.metrics).split("\n\n", 1)
    if len(tail) == 2:
        con.print(tail[1].strip())


def print_decision_vs_size(con: Console, settings: SimSettings, outcome: SimOutcome) -> None:
    """Median decision ms, one row per policy and one column per cluster size."""
    from rich.table import Table

    con.print(f"decision ms vs cluster size ({settings.decision_queue} queued jobs; median; the snapshot built "
              "beforehand, as the live scheduler keeps it):")  # fmt: skip
    sized = Table()
    sized.add_column("policy")
    gpus = sorted({int(r["gpus"]) for r in outcome.scale})
    for g in gpus:
        sized.add_column(f"{g:,} GPUs", justify="right")
    for name in settings.policies:
        ms = {int(r["gpus"]): float(r["decision_ms_median"]) for r in outcome.scale if r["policy"] == name}
        sized.add_row(name, *(f"{ms[g]:.2f}" if ms[g] < 100 else f"{ms[g]:,.0f}" for g in gpus))
    con.print(sized)


def _cell(value: float | int, scale: float) -> str:
    if isinstance(value, int):
        return str(value)
    v = value / scale
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
