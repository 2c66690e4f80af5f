"""Decision time of HAS (frenzy) vs the Sia ILP on the same cluster state, as the cluster grows.

One command, JSON on stdout:

    .venv/bin/python bench/has_decision.py                    # 100, 1,000 and 10,000 GPUs
    .venv/bin/python bench/has_decision.py --sizes 100,1000 --plot docs/img/decision_vs_size.png

For each size: a heterogeneous cluster (H100 / A100-80GB / A100-40GB / L4 in fixed
proportions), filled to about 60 % with running jobs (placed by HAS, with estimated end
times), plus 1,000 queued LLM jobs with MARP's ranked plans. Then, on that same state:

* frenzy: one ``has.schedule`` pass over the 1,000 queued jobs with
  ``QueuePolicy.frenzy()`` — without the per-plan pending reasons (``explain=False``: the
  simulator, and the service's ticks between two explained ones) and with them
  (``frenzy+reasons``, ``explain=True``: what the service builds at most once a second);
* frenzy-paper: the same with ``QueuePolicy()`` (and ``frenzy-paper+reasons``);
* ``frenzy-completion``: the same with ``QueuePolicy.named("frenzy-completion")`` (the
  completion-time plan choice, the live default until issue 18);
* ``frenzy+recent-starts``: the frenzy-completion pass when every running job started 10 s
  ago, so it also weighs preemption (``QueuePolicy.preempt_within_s``) for the most recent few;
* ``frenzy+running``: the frenzy pass given every running job as resumable (started an hour
  ago), so it also weighs the long-job stop (``QueuePolicy.preempt_long_gain``);
* ``frenzy+starving`` / ``frenzy-paper+starving``: the same queue with one wide job waiting
  10 h, so the pass also computes the GPUs held for it (``drain_target``);
* ``frenzy-source``: the frenzy pass run by the plain source of the modules mypyc compiles
  at install (``has._native.load_sources``), alternating pass by pass with the installed
  build (``has_native`` in the output says whether that is the compiled one);
  ``source_over_installed`` is their ratio of medians;
* sia: one round of ``SiaPolicy.decide`` (build the ILP over queued + running jobs, solve
  with HiGHS, place).

Timed per HAS row: ``--reps`` passes on the same view and the same ``QueuedJob`` objects
(as the simulator hands them over between events: it caches a job's QueuedJob until the
job's remaining work changes), reported as median, mean, min and max (ms) and the per-job
share; plus ``fresh_view_ms_median``: passes on a ``ClusterView`` built anew from the same
nodes each time (nothing derived from the snapshot is reused, as in the simulator);
``tick_view_ms_median``: passes on the view the scheduler service has on a tick — the same
state, but reached by ``ClusterView.updated`` from the previous tick's view, which differed
in 8 nodes (some GPUs released, some taken) and had a pass run on it — and, per size, ``view_build_ms_median`` (building a view from scratch) and
``view_update_ms_median`` (that update): not part of a decision. Ratios sia / HAS use
medians of the same run. ``cpu_ref_us``: a fixed pure-Python loop timed on the same
machine, to compare runs across machines (decision times scale with it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import has
from has import ClusterView, PlanOption, QueuedJob, QueuePolicy, RunningJob, schedule
from has._native import load_sources
from has.placement import choose_nodes
from has.sim.baselines import FrenzyPolicy, SiaPolicy
from has.sim.engine import SimView
from has.sim.scale import build_state


def changed_nodes(nodes: tuple, count: int = 8) -> list:
    """The nodes after a tick's worth of change: half of ``count`` nodes with busy GPUs free them
    (a job ended), half with free GPUs have them taken (a job started)."""
    out = list(nodes)
    busy = [i for i, n in enumerate(out) if any(g.owner for g in n.gpus)][: count // 2]
    idle = [i for i, n in enumerate(out) if any(g.is_free for g in n.gpus)][: count - len(busy)]
    for i in busy + idle:
        n = out[i]
        gpus = tuple(dataclasses.replace(g, owner=None, free_at=None) if i in busy else
                     (dataclasses.replace(g, owner="tick", free_at=None) if g.is_free else g) for g in n.gpus)
        out[i] = dataclasses.replace(n, gpus=gpus)
    return out


def waits_for_release(cluster: ClusterView, plan: PlanOption) -> bool:
    """``plan`` does not fit the free GPUs now, but fits the cluster once jobs end."""
    fits_later = cluster.capacity_groups(plan.gpu_type, plan.bytes_per_gpu, plan.tp) * plan.tp >= plan.num_gpus
    return fits_later and choose_nodes(cluster, plan) is None


def cpu_ref_us(reps: int = 2000) -> float:
    """Median µs of ``sum(range(1000))``: how fast this machine runs plain Python."""
    out = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            sum(range(1000))
        out.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(out)


def _time(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def _row(gpus: int, policy: str, ms: list[float], queued: int, extra: dict | None = None) -> dict:
    ms_sorted = sorted(ms)
    row = {
        "gpus": gpus, "policy": policy, "reps": len(ms), "pass_ms_median": statistics.median(ms),
        "pass_ms_mean": statistics.fmean(ms), "pass_ms_min": ms_sorted[0], "pass_ms_max": ms_sorted[-1],
        "queued_jobs": queued, "per_job_ms_median": statistics.median(ms) / queued,
    }  # fmt: skip
    row.update(extra or {})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--reps", type=int, default=21, help="timed repetitions of each HAS pass")
    ap.add_argument("--fresh-reps", type=int, default=7, help="timed HAS passes on a freshly built view")
    ap.add_argument("--sia-reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, default=None, help="also write decision time vs size (PNG)")
    args = ap.parse_args()

    rows = []
    for gpus in (int(s) for s in args.sizes.split(",")):
        sim, now = build_state(gpus, args.seed)
        view = SimView(sim, now)
        cluster = view.cluster
        frenzy = FrenzyPolicy("frenzy", QueuePolicy.frenzy(explain=False))
        queue = [frenzy.queued_job(j) for j in view.queue]
        build = _time(lambda n=cluster.nodes: ClusterView(n), args.fresh_reps)
        before = changed_nodes(cluster.nodes)  # the previous tick's nodes
        base = ClusterView(before)
        update = _time(lambda b=base, n=cluster.nodes: b.updated(n), args.fresh_reps)
        state = {"cluster_gpus": sim.total_gpus, "busy_gpus": len(sim.owner), "running_jobs": len(sim.running),
                 "plans_per_job": statistics.fmean(len(q.plans) for q in queue),
                 "view_build_ms_median": statistics.median(build),
                 "view_update_ms_median": statistics.median(update)}  # fmt: skip
        for name, qp in (
            ("frenzy", QueuePolicy.frenzy(explain=False)),
            ("frenzy+reasons", QueuePolicy.frenzy()),
            # the live default until issue 18 (completion-time plan choice), for comparison
            ("frenzy-completion", QueuePolicy.named("frenzy-completion", explain=False)),
            ("frenzy-paper", QueuePolicy(explain=False)),
            ("frenzy-paper+reasons", QueuePolicy()),
        ):
            schedule(cluster, queue, now, qp)  # warm-up
            ms = _time(lambda c=cluster, q=queue, t=now, qp=qp: schedule(c, q, t, qp), args.reps)
            fresh = []
            for _ in range(args.fresh_reps):
                view_now = ClusterView(cluster.nodes)
                fresh += _time(lambda c=view_now, q=queue, t=now, qp=qp: schedule(c, q, t, qp), 1)
            tick = []
            for _ in range(args.fresh_reps):
                previous = ClusterView(before)
                schedule(previous, queue, now, qp)  # the last tick's pass warmed its indexes
                view_now = previous.updated(cluster.nodes)
                tick += _time(lambda c=view_now, q=queue, t=now, qp=qp: schedule(c, q, t, qp), 1)
            placed = len(schedule(cluster, queue, now, qp).placements)
            extra = {**state, "placed": placed, "fresh_view_ms_median": statistics.median(fresh),
                     "tick_view_ms_median": statistics.median(tick)}
            rows.append(_row(sim.total_gpus, name, ms, len(queue), extra))
        # A starving job (waiting 10 h) that no free GPUs can take now but the cluster could
        # once jobs end — one job's plans that are too wide for the free GPUs (every job here
        # has some narrow plan that fits a 60 %-busy cluster) — so the pass also computes the
        # GPUs to hold for it (``drain_target``): frenzy for the plan the job waits for, the
        # paper's HAS for every plan of the job.
        wide_plans = [tuple(p for p in q.plans if waits_for_release(cluster, p)) for q in queue]
        wide = max(range(len(queue)), key=lambda i: (len(wide_plans[i]), -i))
        starving = list(queue)
        starving[wide] = QueuedJob(queue[wide].job_id, queue[wide].seq, now - 36_000.0, wide_plans[wide])
        for name, qp in (
            ("frenzy+starving", QueuePolicy.frenzy(explain=False)),
            ("frenzy-paper+starving", QueuePolicy(explain=False, starvation_s=14_400.0)),
        ):
            schedule(cluster, starving, now, qp)  # warm-up
            ms = _time(lambda c=cluster, q=starving, t=now, qp=qp: schedule(c, q, t, qp), args.fresh_reps)
            res = schedule(cluster, starving, now, qp)
            target = sum(c for _, c in res.reservation.target) if res.reservation is not None else 0
            held = res.reservation.held_count if res.reservation is not None else 0
            rows.append(_row(sim.total_gpus, name, ms, len(queue), {**state, "placed": len(res.placements),
                                                                   "drain_target_gpus": target, "held_gpus": held,
                                                                   "starving_plans": len(wide_plans[wide])}))
        # The same frenzy pass run by the plain source (has._native.load_sources), alternating
        # pass by pass with the installed build so both see the same machine: what the mypyc
        # build buys (both builds ran in the "frenzy" row's place before; only the ratio is new).
        src = load_sources("has_bench_source")
        src_queue = [src["queued"].QueuedJob(q.job_id, q.seq, q.submitted_at, tuple(
            src["placement"].PlanOption(p.gpu_type, p.tp, p.pp, p.dp, p.bytes_per_gpu, p.label, p.runtime_s)
            for p in q.plans)) for q in queue]  # fmt: skip
        src_qp = src["policy"].QueuePolicy.frenzy(explain=False)
        src_schedule = src["queue_pass"].schedule
        qp = QueuePolicy.frenzy(explain=False)
        src_cluster = src["cluster"].ClusterView(cluster.nodes)  # the source's own view
        src_schedule(src_cluster, src_queue, now, src_qp)  # warm-up
        built, plain = [], []
        for _ in range(args.reps):
            built += _time(lambda c=cluster, q=queue, t=now, qp=qp: schedule(c, q, t, qp), 1)
            plain += _time(lambda c=src_cluster, q=src_queue, t=now, qp=src_qp, f=src_schedule: f(c, q, t, qp), 1)
        rows.append(_row(sim.total_gpus, "frenzy-source", plain, len(queue), {
            **state, "interleaved_with_installed_ms_median": statistics.median(built),
            "source_over_installed": statistics.median(plain) / statistics.median(built),
        }))  # fmt: skip
        # Every running job started 10 s ago (as after a burst of arrivals): the pass also
        # weighs preemption (QueuePolicy.preempt_within_s, on in frenzy-completion, which
        # preempts; the default frenzy does not) for the most recent few.
        recent = [RunningJob(j, now - 10.0, now - 10.0) for j in sorted(sim.running)]
        qp = QueuePolicy.named("frenzy-completion", explain=False)
        schedule(cluster, queue, now, qp, recent)  # warm-up
        ms = _time(lambda c=cluster, q=queue, t=now, qp=qp, r=recent: schedule(c, q, t, qp, r), args.reps)
        res = schedule(cluster, queue, now, qp, recent)
        rows.append(_row(sim.total_gpus, "frenzy+recent-starts", ms, len(queue),
                         {**state, "placed": len(res.placements), "preemptions": len(res.preemptions)}))  # fmt: skip
        # Every running job resumable (the live loop hands HAS those whose spec says so), started
        # an hour ago: the default pass also weighs the long-job stop (QueuePolicy.preempt_long_gain).
        resumable = [RunningJob(j, now - 3600.0, now - 3600.0) for j in sorted(sim.running)]
        qp = QueuePolicy.frenzy(explain=False)
        schedule(cluster, queue, now, qp, resumable)  # warm-up
        ms = _time(lambda c=cluster, q=queue, t=now, qp=qp, r=resumable: schedule(c, q, t, qp, r), args.reps)
        res = schedule(cluster, queue, now, qp, resumable)
        rows.append(_row(sim.total_gpus, "frenzy+running", ms, len(queue),
                         {**state, "placed": len(res.placements), "preemptions": len(res.preemptions),
                          "running_jobs": len(resumable)}))  # fmt: skip
        sia = SiaPolicy()
        ms = _time(lambda p=sia, s=sim, t=now: p.decide(SimView(s, t)), args.sia_reps)
        rows.append(_row(sim.total_gpus, "sia", ms, len(queue),
                         {**state, "ilp_vars": sia.last_ilp[0], "ilp_rows": sia.last_ilp[1]}))  # fmt: skip
        print(f"{sim.total_gpus} GPUs done", file=sys.stderr)

    ratios = {}
    for gpus in sorted({r["gpus"] for r in rows}):
        by = {r["policy"]: r for r in rows if r["gpus"] == gpus}
        s = by["sia"]["pass_ms_median"]
        ratios[str(gpus)] = {
            "sia_over_frenzy": s / by["frenzy"]["pass_ms_median"],
            "sia_over_frenzy_with_reasons": s / by["frenzy+reasons"]["pass_ms_median"],
            "sia_over_frenzy_fresh_view": s / by["frenzy"]["fresh_view_ms_median"],
            "sia_over_frenzy_tick_view": s / by["frenzy"]["tick_view_ms_median"],
            "sia_over_frenzy_paper": s / by["frenzy-paper"]["pass_ms_median"],
            "sia_over_frenzy_completion": s / by["frenzy-completion"]["pass_ms_median"],
        }
    out = {"bench": "has_decision", "python": platform.python_version(), "machine": platform.machine(),
           "cpu_ref_us": cpu_ref_us(), "has_native": has.NATIVE, "rows": rows, "ratios": ratios}  # fmt: skip
    if args.plot is not None:
        from has.sim.report import plot_decision_vs_size

        plot_decision_vs_size(
            [r for r in rows if r["policy"] in ("frenzy", "frenzy+reasons", "frenzy-paper", "sia")], args.plot
        )
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
