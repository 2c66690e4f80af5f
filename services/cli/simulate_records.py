"""What one `frenzy simulate` passes between its steps: the options checked (``SimSettings``), the
files read (``SimInputs``) and the results (``SimOutcome``). A module of their own so that the
run (``frenzy.cli.cmd_simulate``) and the output (``frenzy.cli.simulate_output``) both import
them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from has.cluster_spec import ClusterSpec
    from has.sim.engine import ProfileBook, SimResult
    from has.sim.traces import TraceJob

# (at_s, node, down_s) as the engine takes a node failure; down_s inf: down for the rest of the run.
NodeFailure = tuple[float, str, float]


@dataclass(frozen=True)
class SimSettings:
    """What one `frenzy simulate` was asked for, checked (files not read yet)."""

    cluster: Path
    trace: Path | None
    synthetic: int  # > 0 exactly when trace is None
    policies: tuple[str, ...]
    max_jobs: int
    jobs_per_hour: float
    seed: int
    seeds: int  # runs at seeds seed .. seed + seeds - 1 (the truth's factors; the trace stays)
    runtime_noise: float
    memory_error: float
    speed_error: float
    restart_s: float
    gavel_round_s: float
    out: Path | None
    save_trace: Path | None
    fail_node: tuple[str, ...]
    decision_sizes: tuple[int, ...]  # increasing, no repeats; empty: no decision timing
    decision_queue: int
    as_json: bool
    truth: str = "independent"  # "independent" (has.sim.truth_independent) or "marp"
    max_width_factor: float | None = None  # every policy held to K x the request; None: unbounded
    # issue 35: deadlines and objectives drawn for jobs that carry none (has.sim.traces.with_goals),
    # and every job's objective forced (None: as the trace or the draw says)
    deadline_share: float = 0.0
    cost_share: float = 0.0
    objective: str | None = None


@dataclass(frozen=True)
class SimInputs:
    """What the files held: the cluster, its profiles, the jobs and the node failures to inject."""

    spec: ClusterSpec
    book: ProfileBook
    jobs: list[TraceJob]
    failures: list[NodeFailure]


@dataclass
class SimOutcome:
    """One result per policy (settings order, first seed), their metrics (mean over seeds), the
    spread (standard deviation over seeds), every seed's metrics, the jobs each policy left
    unfinished in any seed (with why), and the decision-time rows."""

    results: list[SimResult] = field(default_factory=list)
    metrics: dict[str, dict[str, float | int]] = field(default_factory=dict)
    spread: dict[str, dict[str, float]] = field(default_factory=dict)
    per_seed: list[dict[str, dict[str, float | int]]] = field(default_factory=list)
    unfinished: dict[str, dict[str, str]] = field(default_factory=dict)
    # one row per (size, policy): gpus, policy, decision_ms_median, reps, queued_jobs, ...
    scale: list[dict[str, float | int | str]] = field(default_factory=list)
