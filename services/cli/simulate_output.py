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

    from frenzy.cli.simulate_records import SimInputs, SimOutcome, SimSettings


def show(settings: SimSettings, inputs: SimInputs, outcome: SimOutcome) -> None:
    """Write the --out files, then print the JSON (--json) or the tables."""
    data = payload(settings, inputs, outcome)
    heading = title(settings, inputs)
    if settings.out is not None:
        write_files(settings.out, settings, outcome, data, heading)
        with (settings.out / "summary.md").open("a") as f:
            f.write("\n" + dollars_table(settings, outcome))
    if settings.as_json:
        import typer

        typer.echo(json.dumps(data))
        return
    con = render.console()
    print_metrics(con, settings, outcome, heading)
    print_deadlines_and_dollars(con, settings, outcome)
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
        "gavel_round_s": settings.gavel_round_s,
        "truth": {"model": settings.truth, "runtime_noise": settings.runtime_noise,
                  "memory_error": settings.memory_error, "speed_error": settings.speed_error},  # fmt: skip
        # K: every policy held to K x the trace's requested GPUs; null: unbounded
        "max_width_factor": settings.max_width_factor,
        "seeds": list(range(settings.seed, settings.seed + settings.seeds)),
        # issue 35: the deadlines and objectives drawn (has.sim.traces.with_goals) and the objective
        # forced on every job (null: as the trace says); each policy's deadline_misses,
        # deadline_miss_rate, gpu_hours and cost_usd are in "policies"
        "goals": {"deadline_share": settings.deadline_share, "cost_share": settings.cost_share,
                  "objective": settings.objective,
                  "deadline_jobs": sum(1 for j in inputs.jobs if j.deadline_s is not None),
                  "cost_jobs": sum(1 for j in inputs.jobs if j.objective == "cost")},  # fmt: skip
        # policy -> job id -> why it did not finish (in any seed); empty when every job finished
        "unfinished": outcome.unfinished,
        # down_s null: down for the rest of the run
        "node_failures": [
            {"node": n, "at_s": at, "down_s": None if down == float("inf") else down}
            for at, n, down in inputs.failures
        ],
    }
    if settings.seeds > 1:
        data["spread"] = outcome.spread
        data["per_seed"] = outcome.per_seed
    if outcome.scale:
        data["decision_vs_size"] = outcome.scale
    # policy -> priority class -> its JCT numbers (first seed), only for a trace with priorities
    if any(len({j.priority for j in r.jobs}) > 1 for r in outcome.results):
        data["by_priority"] = {r.policy: {str(p): m for p, m in r.by_priority().items()} for r in outcome.results}
    return data


def settings_line(settings: SimSettings) -> str:
    """The seeds and the truth's error settings, printed with every table."""
    seeds = (f"seed {settings.seed}" if settings.seeds == 1
             else f"seeds {settings.seed}-{settings.seed + settings.seeds - 1} (mean ± sd)")  # fmt: skip
    width = ("unbounded width" if settings.max_width_factor is None
             else f"at most {settings.max_width_factor:g}x the requested GPUs")  # fmt: skip
    return (f"{seeds}; truth: {settings.truth}, runtime noise {settings.runtime_noise:g}, memory error "
            f"{settings.memory_error:g}, speed error {settings.speed_error:g}; restart {settings.restart_s:g} s; "
            f"{width}")  # fmt: skip


def unfinished_sets(outcome: SimOutcome) -> dict[str, frozenset[str]]:
    return {name: frozenset(left) for name, left in outcome.unfinished.items()}


def unfinished_lines(outcome: SimOutcome) -> list[str]:
    """One line per policy that left jobs unfinished: how many and why (grouped)."""
    lines = []
    for name, left in outcome.unfinished.items():
        if not left:
            continue
        why: dict[str, list[str]] = {}
        for job_id, reason in left.items():
            why.setdefault(reason, []).append(job_id)
        parts = [f"{len(ids)} {reason} (e.g. {', '.join(sorted(ids)[:3])})" for reason, ids in why.items()]
        lines.append(f"{name} did not finish {len(left)} jobs: " + "; ".join(parts))
    return lines


def title(settings: SimSettings, inputs: SimInputs) -> str:
    source = settings.trace or f"synthetic (seed {settings.seed})"
    return f"{len(inputs.jobs)} jobs from {source} on {settings.cluster} ({inputs.spec.total_gpus} GPUs)"


def write_files(
    out: Path, settings: SimSettings, outcome: SimOutcome, data: dict[str, Any], heading: str
) -> None:
    """results.json, summary.md and the plots in ``out`` (--out; created if missing)."""
    from has.sim.report import markdown_table, plot_decision_vs_size, priority_table, write_plots

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    table = markdown_table(outcome.metrics, f"**{heading}**", spread=outcome.spread if settings.seeds > 1 else None,
                           unfinished=unfinished_sets(outcome), settings=settings_line(settings))  # fmt: skip
    notes = unfinished_lines(outcome)
    classes = priority_table(outcome.results)
    if classes:
        table += f"\nJCT by priority class ({settings_seed_note(settings)}):\n\n" + classes
    (out / "summary.md").write_text(table + ("\n" + "\n".join(f"- {n}" for n in notes) + "\n" if notes else ""))
    write_plots(outcome.results, out)
    if outcome.scale:
        plot_decision_vs_size(outcome.scale, out / "decision_vs_size.png", queued=settings.decision_queue)


def print_metrics(con: Console, settings: SimSettings, outcome: SimOutcome, heading: str) -> None:
    """One row per policy, the settings, the unfinished jobs and why, then the comparison lines."""
    from rich.table import Table

    from has.sim.report import COLUMNS, cell, markdown_table, priority_table

    table = Table(title=heading, caption=settings_line(settings))
    table.add_column("policy")
    for _, head, _ in COLUMNS:
        table.add_column(head, justify="right")
    spread = outcome.spread if settings.seeds > 1 else {}
    for name, m in outcome.metrics.items():
        table.add_row(name, *(cell(m, k, s, spread.get(name)) for k, _, s in COLUMNS))
    con.print(table)
    for line in unfinished_lines(outcome):
        con.print(line, markup=False)
    tail = markdown_table(outcome.metrics, unfinished=unfinished_sets(outcome)).split("\n\n", 2)
    if len(tail) == 3:
        con.print(tail[2].strip(), markup=False)
    classes = priority_table(outcome.results)
    if classes:
        con.print(f"JCT by priority class ({settings_seed_note(settings)}):", markup=False)
        con.print(classes.strip(), markup=False)


def _objective_note(settings: SimSettings) -> str:
    forced = f"every job's objective {settings.objective}" if settings.objective else "objectives as the trace says"
    return (f"deadlines drawn for {settings.deadline_share:g} of the jobs, cost objective for "
            f"{settings.cost_share:g}; {forced}; dollars = GPU-hours held x the type's price per GPU-hour")


def dollars_table(settings: SimSettings, outcome: SimOutcome) -> str:
    """Per policy: jobs with a deadline, those that missed it, the miss rate, GPU-hours and dollars
    (markdown, for --out's summary.md)."""
    lines = [f"Deadlines and dollars ({_objective_note(settings)}):", "",
             "| policy | deadline jobs | missed | miss rate | GPU-hours | dollars |", "|---|---:|---:|---:|---:|---:|"]
    for name, m in outcome.metrics.items():
        lines.append(f"| {name} | {_n(m.get('deadline_jobs', 0))} | {_n(m.get('deadline_misses', 0))} | "
                     f"{float(m.get('deadline_miss_rate', 0.0)):.1%} | {float(m.get('gpu_hours', 0.0)):,.1f} | "
                     f"${float(m.get('cost_usd', 0.0)):,.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _n(value: float | int) -> str:
    return str(int(value)) if float(value) == int(value) else f"{float(value):.1f}"


def print_deadlines_and_dollars(con: Console, settings: SimSettings, outcome: SimOutcome) -> None:
    """One row per policy: deadline misses (of the jobs with a deadline) and the dollars spent."""
    from rich.table import Table

    table = Table(title="deadlines and dollars", caption=_objective_note(settings))
    for head in ("policy", "deadline jobs", "missed", "miss rate", "GPU-hours", "dollars"):
        table.add_column(head, justify="left" if head == "policy" else "right")
    for name, m in outcome.metrics.items():
        table.add_row(name, _n(m.get("deadline_jobs", 0)), _n(m.get("deadline_misses", 0)),
                      f"{float(m.get('deadline_miss_rate', 0.0)):.1%}", f"{float(m.get('gpu_hours', 0.0)):,.1f}",
                      f"${float(m.get('cost_usd', 0.0)):,.2f}")  # fmt: skip
    con.print(table)


def settings_seed_note(settings: SimSettings) -> str:
    """Which run the per-class table shows: the first seed's (``SimOutcome.results``)."""
    return f"seed {settings.seed}" if settings.seeds == 1 else f"first seed, {settings.seed}"


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
