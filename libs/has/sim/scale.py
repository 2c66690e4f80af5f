"""Decision time as the cluster grows: the states a policy's decision is timed on.

``bench/has_decision.py`` (the pass alone, every variant, side by side with the Sia ILP) and
``frenzy simulate --decision-sizes`` (each simulated policy's own ``decide``, for the results
folder's decision-time-vs-size plot) time decisions on the same kind of state:

* a heterogeneous cluster of about N GPUs (``cluster_of``: ~25 % H100, 35 % A100-80GB, 20 %
  A100-40GB, 8 per node; the rest L4, 4 per node);
* filled to about 60 % with running jobs from the synthetic generator, each placed by HAS on
  its narrowest MARP plan that fits, with its estimated end (what completion-time plan choice
  reads);
* ``queued`` jobs from the generator waiting, with MARP's ranked plans.

Deterministic for a seed. What is timed is one decision on that state with the snapshot
already built: the live scheduler keeps its view from tick to tick (``ClusterView.updated``),
so building the snapshot is not part of deciding; ``bench/has_decision.py`` also reports
passes on freshly built views.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from has import QueuedJob, QueuePolicy, schedule
from has.cluster_spec import parse_cluster
from has.sim.baselines import FrenzyPolicy, make_policy
from has.sim.engine import Simulator, SimView, Start
from has.sim.traces import synthetic

QUEUED = 1000
MIN_GPUS = 8
MAX_GPUS = 100_000


def cluster_of(gpus: int) -> dict:
    """A cluster file (``frenzy up`` YAML, as a dict) of about ``gpus`` GPUs in four types:
    ~25 % H100, 35 % A100-80GB, 20 % A100-40GB (8 per node), 20 % L4 (4 per node); at least
    one node of each, so small sizes round up."""
    h = max(1, round(gpus * 0.25 / 8))
    a = max(1, round(gpus * 0.35 / 8))
    s = max(1, round(gpus * 0.20 / 8))
    rest = gpus - 8 * (h + a + s)
    l4 = max(1, rest // 4)
    return {"nodes": [
        {"gpu": "H100-80GB", "count": h, "gpus_per_node": 8},
        {"gpu": "A100-80GB", "count": a, "gpus_per_node": 8},
        {"gpu": "A100-40GB", "count": s, "gpus_per_node": 8, "name_prefix": "a100s"},
        {"gpu": "L4", "count": l4, "gpus_per_node": 4},
    ]}  # fmt: skip


class _Idle:
    """A policy that never starts anything: the state is built by hand (``build_state``)."""

    name, round_s = "idle", None

    def decide(self, view: SimView) -> list:
        return []


def build_state(gpus: int, seed: int, queued: int = QUEUED) -> tuple[Simulator, float]:
    """A simulator holding the state described in the module docstring, and the time to decide
    at. Raises ``ValueError`` for a size outside [MIN_GPUS, MAX_GPUS] or a negative queue."""
    if not MIN_GPUS <= gpus <= MAX_GPUS:
        raise ValueError(f"cluster size must be {MIN_GPUS}..{MAX_GPUS:,} GPUs, got {gpus}")
    if queued < 0:
        raise ValueError(f"queued jobs must be >= 0, got {queued}")
    spec = parse_cluster(cluster_of(gpus))
    fill = synthetic(max(50, spec.total_gpus), seed=seed + 1, jobs_per_hour=1e6)
    waiting = synthetic(queued, seed=seed, jobs_per_hour=1e6) if queued else []
    fill = [j.__class__(**{**j.__dict__, "job_id": "run-" + j.job_id, "submit_s": 0.0}) for j in fill]
    waiting = [j.__class__(**{**j.__dict__, "job_id": "q-" + j.job_id, "submit_s": 1.0}) for j in waiting]
    sim = Simulator(spec, fill + waiting, _Idle())
    # Running jobs: each on its narrowest MARP plan that fits, one at a time, until ~60 % busy.
    for j in fill:
        if len(sim.owner) >= 0.6 * sim.total_gpus:
            break
        sim._handle(0.0, 0, j.job_id, 0)
        info = sim.info[j.job_id]
        order = sorted(range(len(info.profile.plans)), key=lambda i: info.profile.plans[i].num_gpus)
        q = QueuedJob(
            j.job_id, 0, 0.0, tuple(FrenzyPolicy.option(info.profile.plans[i], info) for i in order)
        )
        res = schedule(sim.cluster_view(), [q], 0.0, QueuePolicy(explain=False))
        for p in res.placements:
            sim._start(0.0, Start(p.job_id, p.plan.gpu_type, tuple(p.gpus()), order[p.plan_index]))
    for job_id in list(sim.queue):  # fill jobs that did not get GPUs are not part of the state
        del sim.queue[job_id]
    for j in waiting:
        sim._handle(1.0, 0, j.job_id, 0)
    return sim, 2.0


def time_decisions(
    policies: Sequence[str],
    sizes: Sequence[int],
    queued: int = QUEUED,
    seed: int = 0,
    reps: int = 5,
    budget_s: float = 3.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, float | int | str]]:
    """For each size and policy (``baselines.make_policy`` names): the median wall time of
    ``policy.decide`` on that state, over ``reps`` decisions (fewer when they exceed
    ``budget_s`` — one Sia round at 10,000 GPUs takes seconds; at least one), after one
    untimed decision (per-job caches warm, as between two simulator events). Each decision
    gets a new ``SimView`` whose snapshot is built before the clock starts; the actions are
    not applied, so every decision sees the same state. Rows: gpus (the cluster's actual
    count), policy, decision_ms_median, reps, queued_jobs, busy_gpus, started (actions of the
    last decision)."""
    rows: list[dict[str, float | int | str]] = []
    for gpus in sizes:
        sim, now = build_state(gpus, seed, queued)
        for name in policies:
            policy = make_policy(name)
            view = SimView(sim, now)
            view.cluster  # noqa: B018 — the snapshot, built outside the timed part
            policy.decide(view)
            times: list[float] = []
            actions: list = []
            while len(times) < max(1, reps) and (not times or sum(times) < budget_s):
                view = SimView(sim, now)
                view.cluster  # noqa: B018
                t0 = time.perf_counter()
                actions = list(policy.decide(view))
                times.append(time.perf_counter() - t0)
            rows.append({
                "gpus": sim.total_gpus, "policy": name, "decision_ms_median": statistics.median(times) * 1e3,
                "reps": len(times), "queued_jobs": len(sim.queue), "busy_gpus": len(sim.owner),
                "started": sum(isinstance(a, Start) for a in actions),
            })  # fmt: skip
            if progress is not None:
                progress(f"{sim.total_gpus} GPUs, {name}: {rows[-1]['decision_ms_median']:.1f} ms")
    return rows


__all__ = ["MAX_GPUS", "MIN_GPUS", "QUEUED", "build_state", "cluster_of", "time_decisions"]
