"""What one simulated run produced, and the metrics ``frenzy simulate`` reports from it.

Role: the engine's accounting, apart from the engine (``has.sim.engine``, which fills these in and
re-exports them): ``JobOutcome`` per job (submit, first start, finish, OOMs, restarts),
``SimResult`` per run, with ``metrics()`` -- the stable JSON shape of ``frenzy simulate --json``
and of every table's cell (bench/sim_tables.py) -- ``by_priority()`` and ``utilization()``.
Pure: plain data and arithmetic, no MARP, no HAS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class JobOutcome:
    """What happened to one job in a simulated run: when it was submitted, first started and
    finished, the GPUs it last ran on, and how often it hit OOM or was restarted."""

    job_id: str
    submit_s: float
    first_start_s: float | None = None
    finish_s: float | None = None
    gpu_type: str | None = None
    gpus: int = 0
    ooms: int = 0
    restarts: int = 0
    priority: int = 0
    deadline_s: float | None = None  # when it had to finish (absolute; None: no deadline)
    gpu_hours: float = 0.0  # GPU-hours it held, every attempt (OOMs and restarts included)
    cost_usd: float = 0.0  # those GPU-hours x their type's price per GPU-hour
    mixed: bool = False  # its last start ran a mixed plan (several GPU types: docs/mixed-plans.md)

    @property
    def missed_deadline(self) -> bool | None:
        """None without a deadline; else whether it did not finish by it (unfinished: missed)."""
        if self.deadline_s is None:
            return None
        return self.finish_s is None or self.finish_s > self.deadline_s + 1e-6

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s


@dataclass
class SimResult:
    policy: str
    total_gpus: int
    jobs: list[JobOutcome]
    decisions_s: list[float]
    busy_timeline: list[tuple[float, int]]  # (time, busy GPUs from then on)
    oom_failures: int
    restarts: int
    placements: list[tuple[float, str, str, tuple[tuple[str, int], ...]]]  # (t, job, type, gpus)
    end_s: float = 0.0  # when the run ended: the last finish, or when nothing more could happen
    unfinished: dict[str, str] = field(default_factory=dict)  # job id -> why it did not finish
    # job id -> the job's runtime alone on 1/N of the cluster (Themis' T_id; see ``Simulator``)
    isolated_s: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float | int]:
        """The stable JSON shape of `frenzy simulate --json` (docs/simulator.md).

        ``avg_jct_s`` and the percentiles are over finished jobs; ``avg_jct_censored_s`` over
        every job, an unfinished one counted until the end of the run (a lower bound on its JCT),
        so a policy cannot look faster by leaving its hardest jobs out. ``rho_*``: Themis'
        finish-time fairness, JCT / isolated time (censored for unfinished jobs)."""
        jcts = sorted(j.jct_s for j in self.jobs if j.jct_s is not None)
        queues = [j.first_start_s - j.submit_s for j in self.jobs if j.first_start_s is not None]
        finished = [j for j in self.jobs if j.finish_s is not None]
        start = min((j.submit_s for j in self.jobs), default=0.0)
        end = max((j.finish_s for j in finished), default=start)
        end_run = max(self.end_s, end)
        censored = [j.jct_s if j.jct_s is not None else max(0.0, end_run - j.submit_s) for j in self.jobs]
        rhos = sorted(c / self.isolated_s[j.job_id] for j, c in zip(self.jobs, censored, strict=True)
                      if self.isolated_s.get(j.job_id, 0.0) > 0)  # fmt: skip
        dec = sorted(d * 1000.0 for d in self.decisions_s)
        with_deadline = [j for j in self.jobs if j.deadline_s is not None]
        missed = sum(1 for j in with_deadline if j.missed_deadline)
        mixed = [j for j in finished if j.mixed]
        return {
            "avg_jct_s": _mean(jcts),
            "p50_jct_s": _pct(jcts, 50),
            "p99_jct_s": _pct(jcts, 99),
            "avg_jct_censored_s": _mean(censored),
            "avg_queue_s": _mean(queues),
            "makespan_s": end - start,
            "utilization": self.utilization(start, end),
            "oom_failures": self.oom_failures,
            "restarts": self.restarts,
            "jobs_finished": len(finished),
            "jobs_total": len(self.jobs),
            "rho_mean": _mean(rhos),
            "rho_max": rhos[-1] if rhos else 0.0,
            "decision_ms_mean": _mean(dec),
            "decision_ms_p99": _pct(dec, 99),
            # issue 35: deadlines kept and dollars spent (every GPU-hour held x its type's price)
            "deadline_jobs": len(with_deadline),
            "deadline_misses": missed,
            "deadline_miss_rate": missed / len(with_deadline) if with_deadline else 0.0,
            "gpu_hours": sum(j.gpu_hours for j in self.jobs),
            "cost_usd": sum(j.cost_usd for j in self.jobs),
            # issue 33: the finished jobs whose (last) run was a mixed plan, and their avg JCT
            "jobs_mixed": len(mixed),
            "avg_jct_mixed_s": _mean([j.jct_s for j in mixed if j.jct_s is not None]),
        }

    def by_priority(self) -> dict[int, dict[str, float | int]]:
        """Per priority class (highest first): jobs, finished, avg JCT over finished jobs, avg JCT
        with unfinished jobs censored at the end of the run (as ``metrics``), avg queueing time.
        What a priority buys one class and costs the others."""
        start = min((j.submit_s for j in self.jobs), default=0.0)
        end_run = max(self.end_s, max((j.finish_s for j in self.jobs if j.finish_s is not None), default=start))
        out: dict[int, dict[str, float | int]] = {}
        for p in sorted({j.priority for j in self.jobs}, reverse=True):
            jobs = [j for j in self.jobs if j.priority == p]
            jcts = [j.jct_s for j in jobs if j.jct_s is not None]
            out[p] = {
                "jobs": len(jobs),
                "jobs_finished": len(jcts),
                "avg_jct_s": _mean(jcts),
                "avg_jct_censored_s": _mean(
                    [j.jct_s if j.jct_s is not None else max(0.0, end_run - j.submit_s) for j in jobs]
                ),
                "avg_queue_s": _mean([j.first_start_s - j.submit_s for j in jobs if j.first_start_s is not None]),
            }
        return out

    def utilization(self, start: float, end: float) -> float:
        """Busy GPU-seconds / (GPUs × (end − start)); GPUs held by a job that will OOM count as busy."""
        if end <= start or self.total_gpus == 0:
            return 0.0
        area = 0.0
        for (t0, busy), (t1, _) in zip(self.busy_timeline, self.busy_timeline[1:] + [(end, 0)], strict=True):
            a, b = max(t0, start), min(t1, end)
            if b > a:
                area += busy * (b - a)
        return area / (self.total_gpus * (end - start))


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _pct(sorted_xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_xs:
        return 0.0
    k = max(0, math.ceil(q / 100.0 * len(sorted_xs)) - 1)
    return float(sorted_xs[k])
