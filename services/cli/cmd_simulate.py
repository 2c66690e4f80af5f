"""`frenzy simulate`: replay a job trace on a cluster file under several policies, side by side.

Thin shell around ``has.sim.engine`` (the simulator), ``has.sim.baselines`` (the policies;
``frenzy`` runs the same ``has.schedule`` as the live scheduler) and ``has.sim.report``.
Three steps: ``check_settings`` (the options, checked, as a ``SimSettings``), ``load_inputs``
(cluster and trace files) with ``run`` (each policy through the simulator), then
``frenzy.cli.simulate_output`` shows and writes the results.
Bad input (cluster file, trace, policy name) exits 2 with a message naming the field.
While the policies run, ``frenzy.cli.progress.SimBars`` draws a bar per policy on a terminal's
stderr (jobs finished, simulated time) from the engine's progress callback; ``--no-progress``
turns them off, and stdout (tables, ``--json``) is the same either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from frenzy.cli.output import JsonOpt, fail
from frenzy.cli.progress import NoProgressOpt
from frenzy.cli.simulate_records import NodeFailure, SimInputs, SimOutcome, SimSettings

if TYPE_CHECKING:
    pass

__all__ = ["NodeFailure", "SimInputs", "SimOutcome", "SimSettings", "check_settings", "load_inputs", "run"]
# run()'s on_progress(policy, seed, finished jobs, jobs in the trace, simulated seconds): the
# engine's SimProgress with the run it belongs to.
RunProgress = Callable[[str, int, int, int, float], None]


PANEL = "Plan a job"


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel=PANEL)(simulate)


# The options, one alias each, so the command's signature reads as a list of what it takes.
ClusterOpt = Annotated[
    Path, typer.Option(help="Cluster file (same YAML as `frenzy up`), e.g. examples/clusters/paper-64.yaml.")
]
TraceOpt = Annotated[
    Path | None, typer.Option(help="Trace: our CSV, a Gavel .trace or a Pollux workload CSV (detected).")
]
PoliciesOpt = Annotated[
    str,
    typer.Option(
        help="Comma-separated: frenzy, frenzy-blind, frenzy-paper, opportunistic, sia, sia-memaware, gavel, "
        "gavel-memaware, gavel-minjct, hadar-approx, frenzy-completion, frenzy-ranked, frenzy-fifo, frenzy-nopreempt, "
        "frenzy-wait4h, frenzy-single, frenzy-nostop, frenzy-restop."
    ),
]
MaxJobsOpt = Annotated[int, typer.Option(help="Only the first N jobs of the trace (0: all).")]
SyntheticOpt = Annotated[int, typer.Option(help="Instead of --trace: N synthetic jobs (seeded by --seed).")]
JobsPerHourOpt = Annotated[float, typer.Option(help="Arrival rate of --synthetic jobs.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of the truth's factors and of --synthetic.")]
SeedsOpt = Annotated[
    int,
    typer.Option(
        help="Run every policy at N seeds (--seed .. --seed+N-1; the truth's factors change, the "
        "trace does not) and show the mean +- standard deviation.",
        metavar="N",
    ),
]
RuntimeNoiseOpt = Annotated[
    float, typer.Option(help="Sigma of the log-normal truth/estimate factor per job.")
]
MemoryErrorOpt = Annotated[
    float,
    typer.Option(
        help="Sigma of the true/predicted peak-memory factor, log-normal, one per job and GPU type "
        "(0: MARP's prediction is the truth). A start whose true peak exceeds the GPU is an OOM.",
        metavar="SIGMA",
    ),
]
SpeedErrorOpt = Annotated[
    float,
    typer.Option(
        help="Sigma of the true/predicted step-time factor, log-normal, one per job and GPU type "
        "(on top of --runtime-noise, which is one per job): the fastest type can differ from MARP's.",
        metavar="SIGMA",
    ),
]
RestartOpt = Annotated[
    float,
    typer.Option(
        help="Seconds a job makes no progress after a restart (preemption, reallocation, node "
        "failure): reloading model and optimizer state. The policies that weigh restarts "
        "(frenzy's preemption, Sia's restart factor) are told the same number."
    ),
]
GavelRoundOpt = Annotated[
    float, typer.Option(help="Round length of gavel, gavel-memaware and gavel-minjct (Gavel's: 360 s).")
]
OutOpt = Annotated[Path | None, typer.Option(help="Write results.json, summary.md and PNG plots here.")]
SaveTraceOpt = Annotated[Path | None, typer.Option(help="Also write the (mapped) jobs in our trace format.")]
FailNodeOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="Inject a node failure: NAME@SECONDS (down for the rest of the run) or "
        "NAME@SECONDS:DOWN_SECONDS (back after that long). Repeatable. Its running jobs are "
        "requeued with their progress (checkpoint) and pay the restart cost."
    ),
]
DecisionSizesOpt = Annotated[
    str | None,
    typer.Option(
        help="Also time each policy's decision on clusters of these sizes (GPUs, comma-separated, "
        "e.g. 100,1000,10000): the same GPU mix ~60 % busy with --decision-queue jobs waiting "
        "(has.sim.scale). Adds decision_vs_size to the JSON and decision_vs_size.png to --out. "
        "Sia's ILP takes seconds per round at 10,000 GPUs.",
        metavar="SIZES",
    ),
]
TruthOpt = Annotated[
    str,
    typer.Option(
        help="What the jobs truly run at: 'independent' (measured scaling from published runs and "
        "Gavel's throughputs, not MARP: has.sim.truth_independent) or 'marp' (MARP's own step time "
        "and peak, times the error factors). The policies see MARP's predictions under both.",
        metavar="independent|marp",
    ),
]
MaxWidthOpt = Annotated[
    float | None,
    typer.Option(
        help="Hold every policy, frenzy included, to at most K x the trace's requested GPUs per job "
        "(raised to the job's smallest plan where that is more); Sia's and Hadar's max_scale become K. "
        "Unset: unbounded (frenzy takes any count MARP lists; Sia and Hadar 2x).",
        metavar="K",
    ),
]
DeadlineShareOpt = Annotated[
    float,
    typer.Option(
        help="Give this share of the jobs that carry no deadline one: U(1.5, 4) x the job's runtime on "
        "its requested A100-80GBs, drawn per job from --seed (has.sim.traces.with_goals; synthetic and "
        "public traces alike). The tables then show each policy's deadline misses.",
        metavar="SHARE",
    ),
]
CostShareOpt = Annotated[
    float,
    typer.Option(help="Give this share of the jobs that carry no objective 'cost' (the rest 'time'), drawn "
                      "as --deadline-share.", metavar="SHARE"),
]
ObjectiveOpt = Annotated[
    str | None,
    typer.Option(
        help="Force every job's objective: time (the plans in MARP's order), cost (the cheapest plan "
        "that meets its deadline: PlanOption.cost_usd) or gpu-hours; deadlines are kept. Run the same "
        "trace with each to compare the dollars spent at the deadline-miss rate.",
        metavar="time|cost|gpu-hours",
    ),
]
DecisionQueueOpt = Annotated[
    int, typer.Option(help="Queued jobs in each --decision-sizes state (the bench uses 1,000).")
]


def simulate(
    cluster: ClusterOpt,
    trace: TraceOpt = None,
    policies: PoliciesOpt = "frenzy,frenzy-paper,opportunistic,sia",
    max_jobs: MaxJobsOpt = 0,
    synthetic: SyntheticOpt = 0,
    jobs_per_hour: JobsPerHourOpt = 20.0,
    seed: SeedOpt = 0,
    seeds: SeedsOpt = 1,
    runtime_noise: RuntimeNoiseOpt = 0.1,
    memory_error: MemoryErrorOpt = 0.0,
    speed_error: SpeedErrorOpt = 0.0,
    restart_s: RestartOpt = 120.0,
    gavel_round_s: GavelRoundOpt = 360.0,
    truth: TruthOpt = "independent",
    max_width_factor: MaxWidthOpt = None,
    out: OutOpt = None,
    save_trace: SaveTraceOpt = None,
    fail_node: FailNodeOpt = None,
    decision_sizes: DecisionSizesOpt = None,
    decision_queue: DecisionQueueOpt = 1000,
    deadline_share: DeadlineShareOpt = 0.0,
    cost_share: CostShareOpt = 0.0,
    objective: ObjectiveOpt = None,
    as_json: JsonOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    """Compare scheduling policies on one trace and one cluster (trace-driven, event-driven).

    Example:

        frenzy simulate --cluster examples/clusters/paper-64.yaml \\
            --trace data/traces/pollux/workloads/workload-1.csv --policies frenzy,frenzy-paper,opportunistic,sia

        frenzy simulate --cluster examples/clusters/paper-64.yaml --synthetic 50 --fail-node a100-1@3600:1800

        frenzy simulate --cluster examples/clusters/paper-64.yaml --synthetic 50 \\
            --decision-sizes 100,1000,10000 --out results/   # + decision time vs cluster size
    """
    from frenzy.cli.progress import SimBars, wanted
    from frenzy.cli.simulate_output import show

    settings = check_settings(
        cluster=cluster, trace=trace, policies=policies, max_jobs=max_jobs, synthetic=synthetic,
        jobs_per_hour=jobs_per_hour, seed=seed, seeds=seeds, runtime_noise=runtime_noise,
        memory_error=memory_error, speed_error=speed_error, restart_s=restart_s, gavel_round_s=gavel_round_s,
        out=out, save_trace=save_trace, fail_node=fail_node or [], decision_sizes=decision_sizes,
        decision_queue=decision_queue, as_json=as_json, truth=truth, max_width_factor=max_width_factor,
        deadline_share=deadline_share, cost_share=cost_share, objective=objective,
    )  # fmt: skip
    inputs = load_inputs(settings)
    if not wanted(no_progress):
        show(settings, inputs, run(settings, inputs))
        return
    with SimBars(settings.policies, range(settings.seed, settings.seed + settings.seeds), len(inputs.jobs)) as bars:
        outcome = run(settings, inputs, on_progress=bars)
    show(settings, inputs, outcome)


def check_settings(
    *,
    cluster: Path,
    trace: Path | None,
    policies: str,
    max_jobs: int,
    synthetic: int,
    jobs_per_hour: float,
    seed: int,
    runtime_noise: float,
    restart_s: float,
    out: Path | None,
    memory_error: float = 0.0,
    speed_error: float = 0.0,
    seeds: int = 1,
    gavel_round_s: float = 360.0,
    save_trace: Path | None,
    fail_node: list[str],
    decision_sizes: str | None,
    decision_queue: int,
    as_json: bool,
    truth: str = "independent",
    max_width_factor: float | None = None,
    deadline_share: float = 0.0,
    cost_share: float = 0.0,
    objective: str | None = None,
) -> SimSettings:
    """The options as ``SimSettings``; exit 2 naming the first option that is wrong.

    Only what needs no file is checked here; ``load_inputs`` checks the rest."""
    from has.sim.baselines import ALIASES, POLICY_NAMES
    from has.sim.engine import TRUTHS
    from has.sim.scale import MAX_GPUS, MIN_GPUS

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        fail("--policies: name at least one policy", 2)
    for n in names:
        if n not in POLICY_NAMES and n not in ALIASES:
            fail(f"--policies: unknown policy {n!r}; known: {', '.join(POLICY_NAMES)}", 2)
    _check_extra(names, out is not None)
    if (trace is None) == (synthetic <= 0):
        fail("give exactly one of --trace FILE or --synthetic N", 2)
    sizes = _sizes(decision_sizes, MIN_GPUS, MAX_GPUS) if decision_sizes is not None else []
    if decision_queue < 0:
        fail(f"--decision-queue: must be >= 0, got {decision_queue}", 2)
    if truth not in TRUTHS:
        fail(f"--truth: one of {', '.join(TRUTHS)}, got {truth!r}", 2)
    if max_width_factor is not None and not (1 <= max_width_factor < math.inf):
        fail(f"--max-width-factor: must be a number >= 1 (K x the requested GPUs), got {max_width_factor}", 2)
    if not 1 <= seeds <= 100:
        fail(f"--seeds: must be 1..100 runs, got {seeds}", 2)
    if not (gavel_round_s >= 1 and gavel_round_s < math.inf):
        fail(f"--gavel-round-s: must be a number of seconds >= 1, got {gavel_round_s}", 2)
    if not (restart_s >= 0 and restart_s < math.inf):
        fail(f"--restart-s: must be a number of seconds >= 0, got {restart_s}", 2)
    for flag, sigma in (("--runtime-noise", runtime_noise), ("--memory-error", memory_error),
                        ("--speed-error", speed_error)):  # fmt: skip
        if not (0 <= sigma <= 2):
            fail(f"{flag}: must be a log-normal sigma in [0, 2], got {sigma}", 2)
    for flag, share in (("--deadline-share", deadline_share), ("--cost-share", cost_share)):
        if not (0 <= share <= 1):
            fail(f"{flag}: must be a share of the jobs in [0, 1], got {share}", 2)
    if objective is not None and objective not in ("time", "cost", "gpu-hours"):
        fail(f"--objective: one of time, cost, gpu-hours, got {objective!r}", 2)
    return SimSettings(
        cluster=cluster, trace=trace, synthetic=synthetic, policies=tuple(names), max_jobs=max_jobs,
        jobs_per_hour=jobs_per_hour, seed=seed, seeds=seeds, runtime_noise=runtime_noise,
        memory_error=memory_error, speed_error=speed_error, restart_s=restart_s, gavel_round_s=gavel_round_s,
        out=out, save_trace=save_trace, fail_node=tuple(fail_node), decision_sizes=tuple(sizes),
        decision_queue=decision_queue, as_json=as_json, truth=truth, max_width_factor=max_width_factor,
        deadline_share=deadline_share, cost_share=cost_share, objective=objective,
    )  # fmt: skip


def load_inputs(settings: SimSettings) -> SimInputs:
    """Read the cluster file and the trace (or make the synthetic jobs), write --save-trace,
    and check --fail-node against the cluster's nodes; exit 2 naming what is wrong."""
    import yaml

    from has.cluster_spec import ClusterSpecError, parse_cluster
    from has.sim.engine import ProfileBook, SimError
    from has.sim.traces import TraceError, force_objective, read_trace, with_goals, write_trace
    from has.sim.traces import synthetic as make_synthetic

    cluster = settings.cluster
    try:
        spec = parse_cluster(yaml.safe_load(cluster.read_text()))
        book = ProfileBook(spec)
    except OSError as exc:
        fail(f"--cluster: cannot read {cluster}: {exc}", 2)
    except yaml.YAMLError as exc:
        fail(f"--cluster: {cluster} is not valid YAML: {exc}", 2)
    except (ClusterSpecError, SimError) as exc:
        fail(f"--cluster {cluster}: {exc}", 2)
    try:
        if settings.trace is not None:
            jobs = read_trace(settings.trace, max_jobs=settings.max_jobs or None)
        else:
            jobs = make_synthetic(
                settings.synthetic, seed=settings.seed, jobs_per_hour=settings.jobs_per_hour
            )
        if settings.deadline_share > 0 or settings.cost_share > 0:
            jobs = with_goals(jobs, settings.seed, settings.deadline_share, settings.cost_share)
        if settings.objective is not None:
            jobs = force_objective(jobs, settings.objective)
    except TraceError as exc:
        fail(f"--trace: {exc}", 2)
    if settings.save_trace is not None:
        write_trace(jobs, settings.save_trace)
    nodes = {name for name, _ in spec.nodes()}
    failures = [_node_failure(f, nodes) for f in settings.fail_node]
    return SimInputs(spec=spec, book=book, jobs=jobs, failures=failures)


def run(settings: SimSettings, inputs: SimInputs, on_progress: RunProgress | None = None) -> SimOutcome:
    """Each policy through the simulator (exit 1 if the simulator refuses), then the
    decision-time rows when --decision-sizes asked for them (progress on stderr).

    ``on_progress`` hears each run's (policy, seed, finished, total, simulated seconds) as the
    engine reports them: at each finish, now and then between, and at the run's end."""
    from rich.markup import escape

    from has.sim.baselines import make_policy
    from has.sim.engine import SimError
    from has.sim.engine import simulate as run_sim
    from has.sim.report import aggregate
    from has.sim.scale import time_decisions

    outcome = SimOutcome()
    for k in range(settings.seeds):
        seed = settings.seed + k
        metrics: dict[str, dict[str, float | int]] = {}
        for name in settings.policies:
            heard = None if on_progress is None else _for_run(on_progress, name, seed)
            try:
                policy = make_policy(name, restart_s=settings.restart_s, gavel_round_s=settings.gavel_round_s,
                                     max_width_factor=settings.max_width_factor)  # fmt: skip
                res = run_sim(
                    inputs.spec, inputs.jobs, policy, seed=seed,
                    runtime_noise=settings.runtime_noise, memory_error=settings.memory_error,
                    speed_error=settings.speed_error, profiles=inputs.book, node_failures=inputs.failures,
                    restart_s=settings.restart_s, progress=heard, truth=settings.truth,
                    max_width_factor=settings.max_width_factor,
                )  # fmt: skip
            except SimError as exc:
                fail(f"simulation failed (seed {seed}): {escape(str(exc))}", 1)
            if k == 0:
                outcome.results.append(res)
            metrics[name] = res.metrics()
            left = outcome.unfinished.setdefault(name, {})
            for job_id, why in res.unfinished.items():
                left.setdefault(job_id, why)
        outcome.per_seed.append(metrics)
    outcome.metrics, outcome.spread = aggregate(outcome.per_seed)
    if settings.decision_sizes:

        def note(line: str) -> None:
            typer.echo(f"decision time: {line}", err=True)

        outcome.scale = time_decisions(
            list(settings.policies), list(settings.decision_sizes), queued=settings.decision_queue,
            seed=settings.seed, progress=note,
        )  # fmt: skip
    return outcome


def _for_run(on_progress: RunProgress, policy: str, seed: int) -> Callable[[int, int, float], None]:
    """The engine's progress callback for one run, passing ``policy`` and ``seed`` along."""

    def heard(finished: int, total: int, now_s: float) -> None:
        on_progress(policy, seed, finished, total, now_s)

    return heard


def _check_extra(policies: list[str], plots: bool) -> None:
    """Exit 2 naming `frenzy[sim]` when a policy or --out needs a dependency that is missing."""
    import importlib.util

    from rich.markup import escape

    from has.sim.engine import SIM_EXTRA

    needs = {"highspy": [p for p in policies if p.startswith(("sia", "gavel"))], "matplotlib": ["--out"] if plots else []}
    for module, users in needs.items():
        if users and importlib.util.find_spec(module) is None:
            fail(escape(f"{', '.join(users)}: {module} is needed for {SIM_EXTRA[module]}; install it with "
                        "pip install 'frenzy[sim]'"), 2)  # fmt: skip


def _node_failure(text: str, nodes: set[str]) -> NodeFailure:
    """``NAME@SECONDS[:DOWN_SECONDS]`` → (at_s, node, down_s) for the engine; exit 2 when bad.

    Without a duration the node stays down for the rest of the run (``down_s`` = inf).
    """
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
