"""`frenzy simulate`: replay a job trace on a cluster file under several policies, side by side.

Thin shell around ``has.sim.engine`` (the simulator), ``has.sim.baselines`` (the policies;
``frenzy`` runs the same ``has.schedule`` as the live scheduler) and ``has.sim.report``.
Bad input (cluster file, trace, policy name) exits 2 with a message naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, fail


def register(app: typer.Typer) -> None:
    app.command()(simulate)


def simulate(
    cluster: Annotated[
        Path,
        typer.Option(help="Cluster file (same YAML as `frenzy up`), e.g. examples/clusters/paper-64.yaml."),
    ],
    trace: Annotated[
        Path | None, typer.Option(help="Trace: our CSV, a Gavel .trace or a Pollux workload CSV (detected).")
    ] = None,
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated: frenzy, frenzy-paper, opportunistic, sia, gavel, frenzy-fifo, "
            "frenzy-ranked, sia-memaware, frenzy-nopreempt."
        ),
    ] = "frenzy,frenzy-paper,opportunistic,sia",
    max_jobs: Annotated[int, typer.Option(help="Only the first N jobs of the trace (0: all).")] = 0,
    synthetic: Annotated[
        int, typer.Option(help="Instead of --trace: N synthetic jobs (seeded by --seed).")
    ] = 0,
    jobs_per_hour: Annotated[float, typer.Option(help="Arrival rate of --synthetic jobs.")] = 20.0,
    seed: Annotated[int, typer.Option(help="Seed of the runtime noise and of --synthetic.")] = 0,
    runtime_noise: Annotated[
        float, typer.Option(help="Sigma of the log-normal truth/estimate factor per job.")
    ] = 0.1,
    restart_s: Annotated[
        float,
        typer.Option(
            help="Seconds a job makes no progress after a restart (preemption, reallocation, node "
            "failure): reloading model and optimizer state. The policies that weigh restarts "
            "(frenzy's preemption, Sia's restart factor) are told the same number."
        ),
    ] = 120.0,
    out: Annotated[
        Path | None, typer.Option(help="Write results.json, summary.md and PNG plots here.")
    ] = None,
    save_trace: Annotated[
        Path | None, typer.Option(help="Also write the (mapped) jobs in our trace format.")
    ] = None,
    fail_node: Annotated[
        list[str] | None,
        typer.Option(
            help="Inject a node failure: NAME@SECONDS (down for the rest of the run) or "
            "NAME@SECONDS:DOWN_SECONDS (back after that long). Repeatable. Its running jobs are "
            "requeued with their progress (checkpoint) and pay the restart cost."
        ),
    ] = None,
    decision_sizes: Annotated[
        str | None,
        typer.Option(
            help="Also time each policy's decision on clusters of these sizes (GPUs, comma-separated, "
            "e.g. 100,1000,10000): the same GPU mix ~60 % busy with --decision-queue jobs waiting "
            "(has.sim.scale). Adds decision_vs_size to the JSON and decision_vs_size.png to --out. "
            "Sia's ILP takes seconds per round at 10,000 GPUs.",
            metavar="SIZES",
        ),
    ] = None,
    decision_queue: Annotated[
        int, typer.Option(help="Queued jobs in each --decision-sizes state (the bench uses 1,000).")
    ] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Compare scheduling policies on one trace and one cluster (trace-driven, event-driven).

    Example:

        frenzy simulate --cluster examples/clusters/paper-64.yaml \\
            --trace data/traces/pollux/workloads/workload-1.csv --policies frenzy,frenzy-paper,opportunistic,sia

        frenzy simulate --cluster examples/clusters/paper-64.yaml --synthetic 50 --fail-node a100-1@3600:1800

        frenzy simulate --cluster examples/clusters/paper-64.yaml --synthetic 50 \\
            --decision-sizes 100,1000,10000 --out results/   # + decision time vs cluster size
    """
    import yaml

    from has.cluster_spec import ClusterSpecError, parse_cluster
    from has.sim.baselines import POLICY_NAMES, make_policy
    from has.sim.engine import ProfileBook, SimError
    from has.sim.engine import simulate as run_sim
    from has.sim.report import COLUMNS, markdown_table, plot_decision_vs_size, write_plots
    from has.sim.scale import MAX_GPUS, MIN_GPUS, time_decisions
    from has.sim.traces import TraceError, read_trace, write_trace
    from has.sim.traces import synthetic as make_synthetic

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        fail("--policies: name at least one policy", 2)
    for n in names:
        if n not in POLICY_NAMES:
            fail(f"--policies: unknown policy {n!r}; known: {', '.join(POLICY_NAMES)}", 2)
    if (trace is None) == (synthetic <= 0):
        fail("give exactly one of --trace FILE or --synthetic N", 2)
    sizes = _sizes(decision_sizes, MIN_GPUS, MAX_GPUS) if decision_sizes is not None else []
    if decision_queue < 0:
        fail(f"--decision-queue: must be >= 0, got {decision_queue}", 2)
    if not (restart_s >= 0 and restart_s < float("inf")):
        fail(f"--restart-s: must be a number of seconds >= 0, got {restart_s}", 2)
    try:
        data = yaml.safe_load(cluster.read_text())
        spec = parse_cluster(data)
        book = ProfileBook(spec)
    except OSError as exc:
        fail(f"--cluster: cannot read {cluster}: {exc}", 2)
    except yaml.YAMLError as exc:
        fail(f"--cluster: {cluster} is not valid YAML: {exc}", 2)
    except (ClusterSpecError, SimError) as exc:
        fail(f"--cluster {cluster}: {exc}", 2)
    try:
        if trace is not None:
            jobs = read_trace(trace, max_jobs=max_jobs or None)
        else:
            jobs = make_synthetic(synthetic, seed=seed, jobs_per_hour=jobs_per_hour)
    except TraceError as exc:
        fail(f"--trace: {exc}", 2)
    if save_trace is not None:
        write_trace(jobs, save_trace)
    failures = [_node_failure(f, {name for name, _ in spec.nodes()}) for f in fail_node or []]

    results = []
    metrics: dict[str, dict[str, float | int]] = {}
    for name in names:
        try:
            res = run_sim(
                spec, jobs, make_policy(name, restart_s=restart_s), seed=seed, runtime_noise=runtime_noise,
                profiles=book, node_failures=failures, restart_s=restart_s,
            )  # fmt: skip
        except SimError as exc:
            fail(f"simulation failed: {exc}", 1)
        results.append(res)
        metrics[name] = res.metrics()
    scale: list[dict[str, float | int | str]] = []
    if sizes:
        def note(line: str) -> None:
            typer.echo(f"decision time: {line}", err=True)

        scale = time_decisions(names, sizes, queued=decision_queue, seed=seed, progress=note)

    payload = {
        "policies": metrics,
        "cluster": {"file": str(cluster), "gpus": spec.total_gpus},
        "trace": {"file": str(trace) if trace else f"synthetic:{synthetic}:seed={seed}", "jobs": len(jobs)},
        "restart_s": restart_s,
        # down_s null: down for the rest of the run
        "node_failures": [
            {"node": n, "at_s": at, "down_s": None if down == float("inf") else down}
            for at, n, down in failures
        ],
    }
    if scale:  # one row per (size, policy): gpus, policy, decision_ms_median, reps, queued_jobs, ...
        payload["decision_vs_size"] = scale
    title = (
        f"{len(jobs)} jobs from {trace or f'synthetic (seed {seed})'} on {cluster} ({spec.total_gpus} GPUs)"
    )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
        (out / "summary.md").write_text(markdown_table(metrics, f"**{title}**"))
        write_plots(results, out)
        if scale:
            plot_decision_vs_size(scale, out / "decision_vs_size.png", queued=decision_queue)
    if as_json:
        typer.echo(json.dumps(payload))
        return
    from rich.table import Table

    table = Table(title=title)
    table.add_column("policy")
    for _, head, _ in COLUMNS:
        table.add_column(head, justify="right")
    for name, m in metrics.items():
        table.add_row(name, *(_cell(m[k], s) for k, _, s in COLUMNS))
    con = render.console()
    con.print(table)
    md = markdown_table(metrics)
    tail = md.split("\n\n", 1)
    if len(tail) == 2:
        con.print(tail[1].strip())
    if scale:
        con.print(f"decision ms vs cluster size ({decision_queue} queued jobs; median; the snapshot built "
                  "beforehand, as the live scheduler keeps it):")
        sized = Table()
        sized.add_column("policy")
        gpus = sorted({int(r["gpus"]) for r in scale})
        for g in gpus:
            sized.add_column(f"{g:,} GPUs", justify="right")
        for name in names:
            ms = {int(r["gpus"]): float(r["decision_ms_median"]) for r in scale if r["policy"] == name}
            sized.add_row(name, *(f"{ms[g]:.2f}" if ms[g] < 100 else f"{ms[g]:,.0f}" for g in gpus))
        con.print(sized)
    if out is not None:
        plots = "jct_cdf.png, utilization.png, decision_ms.png" + (", decision_vs_size.png" if scale else "")
        con.print(f"results in {out}/ (results.json, summary.md, {plots})")


def _node_failure(text: str, nodes: set[str]) -> tuple[float, str, float]:
    """``NAME@SECONDS[:DOWN_SECONDS]`` → (at_s, node, down_s) for the engine; exit 2 when bad.

    Without a duration the node stays down for the rest of the run (``down_s`` = inf).
    """
    import math

    name, sep, when = text.rpartition("@")
    at_text, _, down_text = when.partition(":")
    try:
        at = float(at_text)
        down = float(down_text) if down_text else math.inf
    except ValueError:
        at = down = math.nan
    if not sep or not name or not (math.isfinite(at) and at >= 0) or not down > 0:
        fail(f"--fail-node {text!r}: expected NAME@SECONDS or NAME@SECONDS:DOWN_SECONDS "
             "(SECONDS >= 0, DOWN_SECONDS > 0)", 2)  # fmt: skip
    if name not in nodes:
        known = ", ".join(sorted(nodes)[:8]) + (", ..." if len(nodes) > 8 else "")
        fail(f"--fail-node {text!r}: no node {name!r} in the cluster file (nodes: {known})", 2)
    return at, name, down


def _sizes(text: str, low: int, high: int) -> list[int]:
    """``--decision-sizes`` as GPU counts; exit 2 naming what is wrong."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        try:
            n = int(part.replace("_", ""))
        except ValueError:
            n = -1
        if not low <= n <= high:
            fail(f"--decision-sizes: {part!r} is not a cluster size in GPUs ({low}..{high:,}), "
                 "e.g. --decision-sizes 100,1000,10000", 2)  # fmt: skip
        out.append(n)
    return sorted(set(out))


def _cell(value: float | int, scale: float) -> str:
    if isinstance(value, int):
        return str(value)
    v = value / scale
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
