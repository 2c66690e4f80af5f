"""``frenzy accuracy``: MARP's predicted peak memory per GPU against what the jobs really used.

Every attempt of a job keeps the plan it ran with (MARP's predicted peak per GPU) and the peak an
agent observed (NVML's per-process used memory on real GPUs, sampled each heartbeat; on fake GPUs
what the job declared in ``$FRENZY_RUN_DIR/peak_bytes``). This command reads the jobs over gRPC
(``ListJobs``: the caller's own jobs, or everyone's for an admin) and shows, by model, GPU type
and layout, how far the prediction was off: the ratio observed / predicted, and the attempts that
ran out of memory. Attempts without an observation are counted but not in the ratios.

The grouping and the numbers are pure (``accuracy_rows``; the ratio is ``frenzy.rpc.job_json``'s, which
the dashboard's job view shows per attempt); the command only fetches and prints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, SchedulerOpt, echo_json, scheduler_call
from frenzy.rpc.job_json import memory_ratio
from frenzy.v1 import scheduler_pb2, types_pb2

GiB = 2**30


@dataclass(frozen=True)
class AccuracyRow:
    """One (model, GPU type, layout) group of attempts."""

    model: str
    gpu_type: str
    layout: str
    attempts: int  # in the group
    observed: int  # of them with an observed peak
    ooms: int  # of them that ran out of memory
    predicted_gib: float  # mean predicted peak per GPU, over the observed attempts (all when none observed)
    observed_gib: float | None  # mean observed peak per GPU
    ratio: float | None  # mean of observed / predicted
    worst_ratio: float | None  # the ratio furthest from 1
    gpu_memory_gib: float


def accuracy_rows(jobs: Iterable[types_pb2.Job], per_job: bool = False) -> list[AccuracyRow]:
    """Group every ended attempt of ``jobs`` by model, GPU type and layout (and job, with
    ``per_job``), most attempts first."""
    groups: dict[tuple[str, ...], list[types_pb2.Attempt]] = {}
    for job in jobs:
        model = job.model_name or job.spec.model.catalog_name or job.spec.model.display_name or "?"
        for a in job.attempts:
            if a.outcome in ("", "running") or not a.gpu_type:
                continue
            key = (model, a.gpu_type, f"{a.num_gpus} GPUs {render.layout_text(a.layout)}")
            groups.setdefault(key + ((job.id,) if per_job else ()), []).append(a)
    rows = []
    for key, attempts in groups.items():
        seen = [a for a in attempts if memory_ratio(a) is not None]
        ratios = [r for r in map(memory_ratio, seen) if r is not None]
        basis = seen or attempts
        model = key[0] if not per_job else f"{key[0]} ({key[3]})"
        rows.append(AccuracyRow(
            model=model, gpu_type=key[1], layout=key[2], attempts=len(attempts), observed=len(seen),
            ooms=sum(1 for a in attempts if a.cause == "oom"),
            predicted_gib=sum(a.predicted_peak_bytes for a in basis) / len(basis) / GiB,
            observed_gib=sum(a.observed_peak_bytes for a in seen) / len(seen) / GiB if seen else None,
            ratio=sum(ratios) / len(ratios) if ratios else None,
            worst_ratio=max(ratios, key=lambda r: abs(r - 1.0)) if ratios else None,
            gpu_memory_gib=max(a.gpu_memory_bytes for a in attempts) / GiB,
        ))
    rows.sort(key=lambda r: (-r.attempts, r.model, r.gpu_type, r.layout))
    return rows


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{(ratio - 1.0) * 100:+.0f}%"


def accuracy_table(rows: list[AccuracyRow]) -> render.Table:
    table = render.Table(title="Predicted against observed peak memory per GPU (MARP)", title_justify="left")
    for col, just in [("MODEL", "left"), ("GPU", "left"), ("LAYOUT", "left"), ("ATTEMPTS", "right"),
                      ("OBSERVED", "right"), ("OOM", "right"), ("PREDICTED GiB", "right"), ("OBSERVED GiB", "right"),
                      ("ERROR", "right"), ("WORST", "right")]:
        table.add_column(col, justify=just)
    for r in rows:
        table.add_row(render.user_text(r.model), render.user_text(r.gpu_type), r.layout, str(r.attempts),
                      str(r.observed), str(r.ooms) if r.ooms else "", f"{r.predicted_gib:.1f} / {r.gpu_memory_gib:.0f}",
                      "-" if r.observed_gib is None else f"{r.observed_gib:.1f}", _pct(r.ratio), _pct(r.worst_ratio))
    return table


def accuracy(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Jobs to read, newest first.")] = 500,
    per_job: Annotated[bool, typer.Option("--per-job", help="One row per job (and layout), not per layout.")] = False,
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """MARP's predicted peak memory per GPU against the peaks the agents observed, by model, GPU type
    and layout (ERROR: observed / predicted - 1, averaged; WORST: the attempt furthest off).

    Observed peaks come from NVML on real GPUs; on fake GPUs a job declares its own by writing the
    bytes to $FRENZY_RUN_DIR/peak_bytes (see docs/failures.md)."""
    with scheduler_call(scheduler) as stub:
        resp = stub.ListJobs(scheduler_pb2.ListJobsRequest(limit=limit), timeout=30)
    rows = accuracy_rows(resp.jobs, per_job=per_job)
    if as_json:
        echo_json([asdict(r) for r in rows])
        return
    con = render.console()
    if not rows:
        con.print("no ended attempts yet: `frenzy accuracy` compares once jobs have run")
        return
    con.print(accuracy_table(rows))
    unseen = sum(r.attempts - r.observed for r in rows)
    if unseen:
        con.print(f"{unseen} attempt(s) without an observed peak (a job on fake GPUs that declared none, or one that "
                  "ended before the agent sampled it)")


PANEL = "Plan a job"


def register(app: typer.Typer) -> None:
    app.command("accuracy", rich_help_panel=PANEL)(accuracy)
