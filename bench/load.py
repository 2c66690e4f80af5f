"""Load on the whole stack: placement throughput in a burst, latency below saturation, and a new
job behind a backlog (issue 15), and CPU per job per kind of process (issue 38). One command; with
``--json`` one JSON line last on stdout.

    .venv/bin/python bench/load.py --agents 100 --gpus-per-agent 8 --jobs 1000 --rate 100 --json
    .venv/bin/python bench/load.py --agents 30 --gpus-per-agent 8 --jobs 300 --rate 50 --backlog 1000
    .venv/bin/python bench/load_runs.py --runs 5 -- --agents 100 --gpus-per-agent 8 --jobs 1000 --rate 100

The local stack (``bench/stack_run.py``: private Redis, predictor, scheduler, one fake-GPU agent
process per node, tokens, signed launches and events, a Redis user per service) runs on loopback
with ``--agents`` nodes of ``--gpus-per-agent`` fake ``--gpu-type`` GPUs. Every measured job is
gpt2-124m (seq 128, global batch 840 = lcm(1..8) with micro batch 1, so that every GPU count
1..8 has a data-parallel plan; 10 training steps, so the scheduler's runtime estimate is 0.7 to
5 s, near the real run, and far below the 120 s switch cost that would make preemption worth
it) that needs exactly k GPUs (``limits.min_gpus`` = ``limits.max_gpus`` = k, k drawn uniformly
from 1..8 with ``--seed``; at most the cluster's GPUs on a toy cluster) and runs
``sleep --job-s``. Submissions go over gRPC from ``--submitters`` threads. Job states are polled
from Redis with the admin connection; every number comes from the jobs' histories as the
scheduler stamped them (``submitted_at``, the RESERVED and RUNNING transitions), read over gRPC
once a phase's jobs have ended. Phases:

1. **Burst.** The queue is held (the key ``frenzy queue hold`` sets, with the admin Redis
   client), ``--jobs`` jobs are submitted as fast as the submitters go, then the queue is
   released and the placements are timed. 1,000 jobs of 4.5 GPUs on average do not all fit
   800 GPUs: after the first wave, placement waits for jobs to end, and its rate is the
   cluster's capacity / the job length, not the scheduler's speed. So:

   * ``placements_per_s``: the first wave's rate: the burst jobs whose first RESERVED
     transition came before the first burst job ended (while free GPUs, not capacity,
     limited placement), their count / (their last RESERVED time - their first);
     ``first_wave`` is that count (None when fewer than 2). When one tick placed the whole
     wave (a batched placement stamps all its jobs with the tick's time, so that span is 0),
     the span is counted from the release instead, which includes the scheduler noticing it;
     ``first_wave_span_from`` says which ("first placement" or "release");
   * ``placements_per_s_overall``: every burst job's first RESERVED / (the last - the first),
     capacity-bound by design;
   * ``burst_release_to_first_placement_s``: the first RESERVED minus the moment of release.

   Then ``--idle-s`` of nothing (``idle_cpu_ms_per_s``: what the idle stack's heartbeats, ticks
   and polling cost a second, per kind of process).

   **Saturation** (``--saturation-jobs``, default ``--jobs``; 0: skipped). The rate the stack
   carries on this machine: that many jobs of the same mix submitted as fast as the submitters go
   with the queue open, so submitting, placing, launching and the cluster's capacity all bound
   it. ``saturation_rate_per_s`` is the rate at which they became RUNNING, sustained: the RUNNING
   transitions from the later of their 20th percentile and the first of these jobs' end (the ramp
   and the empty cluster's first wave left out) to their 90th percentile (the drain left out),
   counted / the time between (``sustained_rate``).

2. **Latency.** On the idle cluster (every earlier job ended), ``--jobs`` more such jobs at
   ``latency_rate_per_s``: the lower of ``--rate`` and half the saturation rate (``--rate`` when
   not measured), so the latencies are those below saturation, not a queue behind a full box:
   ``submit_to_running_p50_s`` / ``_p99_s`` (first RUNNING minus ``submitted_at``),
   ``submit_p50_ms`` / ``submit_p99_ms`` (SubmitJob's round trip as the client saw it),
   ``offered_rate_per_s`` (the rate submissions really started at).

3. **Backlog** (``--backlog N``, default 0: skipped). The cluster then has ``--backlog-agents``
   more nodes (default: as many as ``--agents``, so half the nodes) of ``--backlog-gpu-type``;
   before phase 1, blocker jobs (that type only, ``sleep`` for the whole run) take every one
   of their GPUs. Here N 1-GPU jobs that may only use that type are queued (they cannot
   start), then one 1-GPU job of any type is submitted: ``backlog_new_job_to_running_s`` is its
   first RUNNING minus its ``submitted_at`` (free GPUs of ``--gpu-type`` wait for it), and
   ``probe_call_to_running_s`` the same from the client's call (SubmitJob's time included). At the
   end the queue is held again and the blockers cancelled; the N jobs stay PENDING
   (``backlog_started`` counts any that started: 0 expected).

Reported beside them: ``submitted`` (the measured jobs: burst, latency and the backlog probe;
not the blockers nor the N backlog jobs), ``succeeded``, ``failed``, ``cancelled`` of those,
``lost`` (not ended by the deadline), ``ran_twice`` (more than one attempt, or entering RUNNING
twice; a history entry repeating the state before it, as a cancel request's note does, is not a
second run; blockers included, ``ran_twice_jobs`` shows up to 5 with their histories),
``refused`` (SubmitJob errors), ``cpu_s`` per process over the whole run and per phase
(scheduler, predictor, the agents summed, Redis), ``scheduler_metrics`` (its /metrics at the
end), the machine (cpus, python, the 1-minute load average before and after: the numbers only
compare on the same machine and load) and the sizes.

CPU per job, the figures that do not depend on the box (issue 38): ``cpu_ms_per_job`` has the
CPU milliseconds per job of each kind of process, ``scheduler`` (the placement loop), ``api``
(SubmitJob and the other calls), ``redis``, ``predictor``, ``agents`` (with their spawners, shims
and commands) and ``load_generator`` (this process), and ``control_plane_cpu_ms_per_job`` their
scheduler + API + Redis; at the top the latency phase's, each phase's in ``phases``, each over
that phase's window (from its start until its jobs had ended; reading their histories back
afterwards is not counted) divided by its jobs. A share of the idle cost is in it
(``idle_cpu_ms_per_s`` / the rate). With ``--split-scheduler`` the API is the ``--serve api``
process and the scheduler the ``--serve loop`` one; in one process (the default) the API is the
CPU of its gRPC threads and the submissions' pool refresh, the scheduler the rest (its threads
name themselves for this: ``bench/thread_names/sitecustomize.py`` on the services' PYTHONPATH;
per thread name in the phase's ``scheduler_threads_cpu_s``). ``bench/load_runs.py`` runs this N
times and quotes each headline figure's median, min and max.

Bounded in time: every phase waits until one deadline, ``--timeout-s`` after the stack is up;
a phase the deadline cuts short reports its unfinished jobs as ``lost`` and later phases are
skipped. The result is always printed; the exit status is 1 when a phase could not complete
(lost or refused jobs, blockers that did not start, a skipped phase: listed in ``problems``),
0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from stack_run import (
    ENDED,
    BenchStack,
    Submission,
    cpu_delta,
    fetch_jobs,
    first_at,
    history_of,
    hold_split,
    job_states,
    machine,
    offered_rate,
    outcome_counts,
    percentile,
    raise_service_limits,
    ran_twice,
    running_stack,
    say_stderr,
    scheduler_metrics,
    service_cpu,
    state_name,
    submit_all,
    submit_latency_ms,
    submit_to_running,
    wait_split,
    wait_states,
)

import marp
from frenzy.state import scripts
from frenzy.v1 import scheduler_pb2, types_pb2
from has.cluster_spec import ClusterSpec, parse_cluster

MAX_K = 8  # jobs need 1..8 GPUs (issue 15)
GLOBAL_BATCH = 840  # lcm(1..8): dp = k divides it for every k, with micro batch 1
TRAIN_STEPS = 10  # runtime estimates of 0.7 s (8 GPUs) to 5 s (1 GPU) on A100-80GB: near the 1 s sleep
HOLD_REASON = "bench/load.py: gathering a burst"
RESERVED, RUNNING = types_pb2.JOB_STATE_RESERVED, types_pb2.JOB_STATE_RUNNING
# saturation_rate_per_s counts the RUNNING transitions between these quantiles (phase_saturation)
SAT_LO_Q, SAT_HI_Q = 0.2, 0.9
ENDED_STATES = (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED)


class Deadline(Exception):
    """The run's deadline passed before a phase could start."""


# ---- CPU per job, per kind of process -----------------------------------------------------------

# On the services' PYTHONPATH: each Python thread gives its OS thread its name (sitecustomize.py there).
THREAD_NAMES = Path(__file__).resolve().parent / "thread_names"
# When the API and the placement loop share the scheduler's process, the API's threads are gRPC's
# (its C core's: "grpc_global_tim", "event_engine", "lifeguard", ...; the server's "_serve"; the
# handler pool's "grpc_N", where SubmitJob, its token check and its predictor call run) and the
# refresh of the submissions' pools. Everything else (the main thread, "scheduler-loop", "events",
# "wakes", "agent-scripts", /metrics) is the scheduler's, and so is the CPU of threads that ended
# within the window (counted in the process's total, no longer in any thread's).
API_THREADS = re.compile(r"grpc_|_serve$|event_engine|lifeguard|default-execut|resolver-execu|timer_manager"
                         r"|pools-refresh")
KINDS = ("scheduler", "api", "redis", "predictor", "agents", "load_generator")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """The live threads of ``pid``: tid -> (name, CPU seconds on a CPU, from schedstat's ns)."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[int(tid)] = (name, ns / 1e9)
    return out


@dataclass(frozen=True)
class CpuSnap:
    procs: dict[str, float]  # service_cpu(): CPU s per service (agents summed), Redis, the load generator
    threads: dict[int, tuple[str, float]]  # the scheduler process's threads (one-process scheduler only)
    redis_cmds: dict[str, tuple[int, int]] = field(default_factory=dict)  # command -> (calls, usec) so far


def redis_commands(admin: object) -> dict[str, tuple[int, int]]:
    """Redis's own count per command (INFO commandstats): command -> (calls, usec inside it)."""
    try:
        info = admin.info("commandstats")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 (a figure beside the others: never the reason a run fails)
        return {}
    return {k.removeprefix("cmdstat_"): (int(v.get("calls", 0)), int(v.get("usec", 0)))
            for k, v in info.items() if isinstance(v, dict)}


def cpu_snapshot(bench: BenchStack, split: bool) -> CpuSnap:
    sched = next((s for s in bench.stack.services if s.name == "scheduler"), None)
    threads = thread_cpu(sched.proc.pid) if (sched is not None and not split) else {}
    return CpuSnap(service_cpu(bench.stack), threads, redis_commands(bench.admin))


def redis_per_job(before: CpuSnap, after: CpuSnap, jobs: int, top: int = 10) -> dict[str, object]:
    """Redis commands per job between two snapshots: calls and usec (time inside the command,
    Redis's own count; its CPU beyond that is I/O), in all and for the ``top`` commands by usec.
    The benchmark's own polling of job states (HGET, pipelined) and INFO are in it."""
    d = {k: (c - before.redis_cmds.get(k, (0, 0))[0], u - before.redis_cmds.get(k, (0, 0))[1])
         for k, (c, u) in after.redis_cmds.items()}
    d = {k: v for k, v in d.items() if v[0] > 0}
    if not jobs or not d:
        return {}
    ranked = sorted(d.items(), key=lambda kv: -kv[1][1])[:top]
    return {"calls": round(sum(c for c, _ in d.values()) / jobs, 2),
            "usec": round(sum(u for _, u in d.values()) / jobs, 1),
            "top": {k: {"calls": round(c / jobs, 2), "usec": round(u / jobs, 1)} for k, (c, u) in ranked}}


def thread_delta(before: CpuSnap, after: CpuSnap) -> dict[str, float]:
    """CPU s per thread name between two snapshots (the handler pool's "grpc_N" summed as "grpc_N")."""
    out: dict[str, float] = {}
    for tid, (name, cpu) in after.threads.items():
        key = re.sub(r"^grpc_\d+$", "grpc_N", name)
        out[key] = out.get(key, 0.0) + cpu - (before.threads[tid][1] if tid in before.threads else 0.0)
    return out


def kind_cpu(before: CpuSnap, after: CpuSnap, split: bool) -> tuple[dict[str, float], dict[str, float]]:
    """CPU s per kind of process (KINDS) between two snapshots, and the one-process scheduler's
    per thread name ({} when split). Split: the API is the ``--serve api`` process ("scheduler"),
    the scheduler the ``--serve loop`` one ("scheduler-loop"); one process: the API is its
    API_THREADS, the scheduler the rest of it."""
    d = {k: after.procs.get(k, 0.0) - before.procs.get(k, 0.0) for k in after.procs}
    threads: dict[str, float] = {}
    if split:
        api, sched = d.get("scheduler", 0.0), d.get("scheduler-loop", 0.0)
    else:
        threads = thread_delta(before, after)
        api = sum(v for name, v in threads.items() if API_THREADS.match(name))
        sched = max(0.0, d.get("scheduler", 0.0) - api)
        # (process CPU is counted in clock ticks, threads' in ns: a few ms of rounding either way)
        threads["(ended threads)"] = max(0.0, d.get("scheduler", 0.0) - sum(threads.values()))
    kinds = {"scheduler": sched, "api": api, "redis": d.get("redis", 0.0), "predictor": d.get("predictor", 0.0),
             "agents": d.get("agents", 0.0), "load_generator": d.get("load_generator", 0.0)}
    return kinds, threads


def per_job_ms(kinds: dict[str, float], jobs: int) -> dict[str, float | None]:
    return {k: (round(kinds[k] * 1000.0 / jobs, 3) if jobs else None) for k in KINDS}


def control_plane_ms(per_job: dict[str, float | None]) -> float | None:
    """Scheduler + API + Redis per job: the control plane issue 38 bounds (the predictor apart:
    its answers are cached per job shape)."""
    parts = [per_job.get(k) for k in ("scheduler", "api", "redis")]
    return None if any(v is None for v in parts) else round(sum(parts), 3)  # type: ignore[arg-type]


def job_spec(name: str, k: int, job_s: float, gpu_types: Sequence[str] = ()) -> types_pb2.JobSpec:
    """A gpt2-124m job that needs exactly ``k`` GPUs (of ``gpu_types``; empty: any) and sleeps ``job_s``."""
    return types_pb2.JobSpec(
        name=name, model=types_pb2.ModelSpec(catalog_name="gpt2-124m"),
        recipe=types_pb2.TrainingRecipe(seq_len=128, global_batch=GLOBAL_BATCH, micro_batch=1,
                                        train_steps=TRAIN_STEPS),
        limits=types_pb2.JobLimits(min_gpus=k, max_gpus=k, allowed_gpu_types=list(gpu_types)),
        command=["sleep", f"{job_s:g}"])  # fmt: skip


def cluster_of(args: argparse.Namespace) -> ClusterSpec:
    groups = [{"gpu": args.gpu_type, "count": args.agents, "gpus_per_node": args.gpus_per_agent,
               "name_prefix": "node"}]
    if args.backlog:
        groups.append({"gpu": args.backlog_gpu_type, "count": args.backlog_agents,
                       "gpus_per_node": args.gpus_per_agent, "name_prefix": "held"})
    return parse_cluster({"nodes": groups})


def blocker_sizes(gpus: int) -> list[int]:
    """GPU counts of blocker jobs that together hold ``gpus`` GPUs, none above MAX_K."""
    return [MAX_K] * (gpus // MAX_K) + ([gpus % MAX_K] if gpus % MAX_K else [])


@dataclass
class Run:
    """What a run accumulates across phases."""

    bench: BenchStack
    args: argparse.Namespace
    deadline: float  # time.monotonic()
    say: callable  # type: ignore[valid-type]
    measured: list[types_pb2.Job] = field(default_factory=list)  # ended or not, as read at the phase's end
    submitted: int = 0
    refused: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)
    errors: set[str] = field(default_factory=set)
    ended_cpu: CpuSnap | None = None  # taken when a phase's jobs had ended, before they are read back

    def submit(self, specs: Sequence[types_pb2.JobSpec], rate: float, label: str, measured: bool = True
               ) -> list[Submission]:
        subs = submit_all(self.bench.stub, specs, rate, self.args.submitters, self.say, label)
        bad = [s for s in subs if not s.job_id]
        self.errors |= {s.error for s in bad}
        if measured:
            self.submitted += len(subs) - len(bad)
            self.refused += len(bad)
        if bad:
            self.problems.append(f"{label}: {len(bad)} of {len(subs)} submissions refused")
        return subs

    def wait_and_read(self, ids: Sequence[str], phase: str,
                      on_ended: callable | None = None) -> list[types_pb2.Job]:  # type: ignore[valid-type]
        """Wait for the measured jobs ``ids`` to end (or the deadline), call ``on_ended``, then read them once."""
        ended = wait_states(self.bench.admin, self.bench.keys, ids, ENDED, self.deadline, self.say)
        self.ended_cpu = self.cpu_now()
        if on_ended is not None:
            on_ended()
        if len(ended) < len(ids):
            self.lost += len(ids) - len(ended)
            self.problems.append(f"{phase}: {len(ids) - len(ended)} of {len(ids)} jobs not ended by the deadline")
        jobs = fetch_jobs(self.bench.stub, ids)
        self.measured += jobs
        return jobs

    def check_time(self, phase: str) -> None:
        if time.monotonic() >= self.deadline:
            self.problems.append(f"{phase}: skipped, the deadline (--timeout-s) passed")
            raise Deadline(phase)

    def cpu_now(self) -> CpuSnap:
        return cpu_snapshot(self.bench, self.args.split_scheduler)

    def phase(self, name: str, fn: callable, jobs_key: str | None = "jobs") -> dict:  # type: ignore[valid-type]
        """Run phase ``fn`` -> its numbers, with the CPU its window took: ``cpu_s`` per process,
        ``cpu_s_by_kind`` (KINDS), and per job of the phase (``jobs_key``: its number of jobs)
        ``cpu_ms_per_job``, ``control_plane_cpu_ms_per_job`` and ``redis_commands_per_job``
        (redis_per_job); a one-process scheduler's CPU per thread name in ``scheduler_threads_cpu_s``. The window runs from the phase's start until
        its jobs had ended (the benchmark's reading of their histories afterwards is not counted)."""
        self.ended_cpu = None
        before = self.cpu_now()
        out = fn()
        after = self.ended_cpu or self.cpu_now()
        kinds, threads = kind_cpu(before, after, self.args.split_scheduler)
        out["cpu_s"] = cpu_delta(before.procs, after.procs)
        out["cpu_s_by_kind"] = {k: round(v, 3) for k, v in kinds.items()}
        if threads:
            out["scheduler_threads_cpu_s"] = {k: round(v, 3) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])}
        if jobs_key is not None:
            out["cpu_ms_per_job"] = per_job_ms(kinds, int(out.get(jobs_key) or 0))
            out["control_plane_cpu_ms_per_job"] = control_plane_ms(out["cpu_ms_per_job"])
            out["redis_commands_per_job"] = redis_per_job(before, after, int(out.get(jobs_key) or 0))
        return out


def ended_at(job: types_pb2.Job) -> float | None:
    return next((t.at for t in job.history if t.state in ENDED_STATES), None)


def burst_numbers(jobs: Sequence[types_pb2.Job], released_at: float) -> dict[str, object]:
    """Placement rates of a burst released at ``released_at`` (wall clock): the first wave's
    (placements before the first job ended) and overall; see the module docstring."""
    reserved = sorted(at for j in jobs if (at := first_at(j, RESERVED)) is not None)
    ends = [at for j in jobs if (at := ended_at(j)) is not None]
    first_end = min(ends) if ends else float("inf")
    wave = [at for at in reserved if at < first_end]
    wave_span, span_from = (wave[-1] - wave[0], "first placement") if len(wave) > 1 else (0.0, None)
    if len(wave) > 1 and wave_span <= 0:
        # one tick placed the whole wave (a batched placement stamps its jobs with the tick's
        # time): no span between placements to divide by, so count from the release instead
        wave_span, span_from = wave[-1] - released_at, "release"
    span = reserved[-1] - reserved[0] if len(reserved) > 1 else 0.0
    k_of = {j.id: j.spec.limits.max_gpus for j in jobs}
    wave_gpus = sum(k_of[j.id] for j in jobs if (at := first_at(j, RESERVED)) is not None and at < first_end)
    return {
        "placements_per_s": len(wave) / wave_span if wave_span > 0 else None,
        "first_wave": len(wave) if len(wave) > 1 else None, "first_wave_gpus": wave_gpus,
        "first_wave_span_s": wave_span, "first_wave_span_from": span_from,
        "placements_per_s_overall": len(reserved) / span if span > 0 else None,
        "placements": len(reserved), "placement_span_s": span,
        "burst_release_to_first_placement_s": reserved[0] - released_at if reserved else None,
    }  # fmt: skip


def phase_burst(run: Run, rng: random.Random, k_max: int) -> dict[str, object]:
    args, bench = run.args, run.bench
    run.check_time("burst")
    hold = bench.keys.queue_hold()
    bench.admin.set(hold, HOLD_REASON)  # what `frenzy queue hold` does
    try:
        run.say(f"burst: holding the queue, submitting {args.jobs} jobs as fast as {args.submitters} threads go")
        specs = [job_spec(f"burst-{i}", rng.randint(1, k_max), args.job_s) for i in range(args.jobs)]
        t0 = time.monotonic()
        subs = run.submit(specs, 0, "burst submitted")
        submit_s = time.monotonic() - t0
    finally:
        released_at = time.time()
        bench.admin.delete(hold)  # `frenzy queue release`
    run.say("burst: queue released")
    ids = [s.job_id for s in subs if s.job_id]
    jobs = run.wait_and_read(ids, "burst")
    lat = submit_latency_ms(subs)
    return {**burst_numbers(jobs, released_at), "jobs": len(ids), "submit_s": submit_s,
            "submit_p50_ms": percentile(lat, 50), "submit_p99_ms": percentile(lat, 99),
            "gpus_asked": sum(j.spec.limits.max_gpus for j in jobs), **outcome_counts(jobs)}


def sustained_rate(times: Sequence[float], not_before: float | None = None, lo_q: float = SAT_LO_Q,
                   hi_q: float = SAT_HI_Q) -> tuple[float | None, float | None, int]:
    """The rate of events at ``times`` over their middle: from the ``lo_q`` quantile, or the first
    event at or after ``not_before`` when that is later (the ramp before it left out), to the
    ``hi_q`` quantile (the drain after it left out): the events between / the time between.
    -> (rate or None, that span in s, events in it). Under 10 events, or when ``not_before`` leaves
    fewer than 2 before the ``hi_q`` one: from the first (or the ``lo_q`` quantile)."""
    ordered = sorted(times)
    n = len(ordered)
    if n < 2:
        return None, None, 0
    if n < 10:
        lo, hi = 0, n - 1
    else:
        lo, hi = int(lo_q * n), max(int(lo_q * n) + 1, int(hi_q * n) - 1)
        if not_before is not None:
            later = next((i for i, t in enumerate(ordered) if t >= not_before), n)
            lo = later if later < hi else lo
    span = ordered[hi] - ordered[lo]
    return ((hi - lo) / span if span > 0 else None), span, hi - lo


def phase_saturation(run: Run, rng: random.Random, k_max: int) -> dict[str, object]:
    """The rate the stack carries: ``--saturation-jobs`` jobs of the latency phase's mix submitted
    as fast as the submitters go with the queue open, so submitting, placing, launching and the
    cluster's capacity (GPUs / job length) all bound it; ``saturation_rate_per_s`` is the rate at
    which they became RUNNING over the middle of them (sustained_rate): the ramp left out (the
    first SAT_LO_Q of the RUNNING transitions, and all before the first of these jobs ended: the
    empty cluster's first wave is not a rate it keeps up) and the drain (the last 1 - SAT_HI_Q)."""
    args = run.args
    run.check_time("saturation")
    run.say(f"saturation: submitting {args.saturation_jobs} jobs as fast as {args.submitters} threads go, queue open")
    specs = [job_spec(f"sat-{i}", rng.randint(1, k_max), args.job_s) for i in range(args.saturation_jobs)]
    subs = run.submit(specs, 0, "saturation submitted")
    jobs = run.wait_and_read([s.job_id for s in subs if s.job_id], "saturation")
    ran = [at for j in jobs if (at := first_at(j, RUNNING)) is not None]
    ends = [at for j in jobs if (at := ended_at(j)) is not None]
    rate, span, counted = sustained_rate(ran, min(ends) if ends else None)
    lat = submit_latency_ms(subs)
    return {"jobs": len(jobs), "saturation_rate_per_s": rate, "rate_span_s": span, "rate_jobs": counted,
            "offered_rate_per_s": offered_rate(subs),
            "submit_p50_ms": percentile(lat, 50), "submit_p99_ms": percentile(lat, 99),
            "gpus_busy_mean": hold_split(jobs)[2], **outcome_counts(jobs)}


def phase_idle(run: Run) -> dict[str, object]:
    """What the idle stack costs a second (heartbeats, ticks, polling), per kind: ``--idle-s`` of
    nothing on the idle cluster. A phase's CPU per job includes its share of this: at r jobs a
    second, idle_cpu_ms_per_s / r of it."""
    run.check_time("idle")
    before = run.cpu_now()
    t0 = time.monotonic()
    time.sleep(run.args.idle_s)
    kinds, _ = kind_cpu(before, run.cpu_now(), run.args.split_scheduler)
    secs = time.monotonic() - t0
    return {"idle_s": round(secs, 3), "idle_cpu_ms_per_s": {k: round(v * 1000.0 / secs, 3) for k, v in kinds.items()}}


def latency_rate(asked: float, saturation: float | None) -> float:
    """The latency phase's rate: ``--rate``, at most half the measured saturation rate."""
    return min(asked, saturation / 2.0) if saturation else asked


SLOWLOG_MAX = 1_000_000  # entries kept while --redis-profile logs every command


def slowlog_start(admin: object) -> None:
    """Have Redis log every command (SLOWLOG at 0 us), from an empty log."""
    admin.config_set("slowlog-max-len", SLOWLOG_MAX)  # type: ignore[attr-defined]
    admin.config_set("slowlog-log-slower-than", 0)  # type: ignore[attr-defined]
    admin.slowlog_reset()  # type: ignore[attr-defined]


def slowlog_profile(admin: object, jobs: int, top: int = 15) -> dict[str, object]:
    """What Redis logged since slowlog_start, per command, each script (EVALSHA) by its name, and
    per job: calls and usec (a script's time includes the commands it runs, which are logged too,
    by Redis's script client: "(in a script)"). Stops the logging (back to 10 ms)."""
    entries = admin.execute_command("SLOWLOG", "GET", SLOWLOG_MAX)  # type: ignore[attr-defined]
    admin.config_set("slowlog-log-slower-than", 10_000)  # type: ignore[attr-defined]
    names = {scripts.sha1(n): n for n in scripts.names()}
    calls: dict[str, list[int]] = {}
    inside = 0
    for entry in entries:
        usec, argv, addr = int(entry[2]), entry[3], str(entry[4] or "")
        cmd = str(argv[0]).lower() if argv else "?"
        if cmd in ("evalsha", "evalsha_ro") and len(argv) > 1:
            cmd = f"{cmd} {names.get(str(argv[1]), str(argv[1])[:12])}"
        if addr in ("", "?:0"):  # Redis's script client
            inside += 1
            cmd = f"{cmd} (in a script)"
        row = calls.setdefault(cmd, [0, 0])
        row[0] += 1
        row[1] += usec
    if not jobs or not calls:
        return {}
    ranked = sorted(calls.items(), key=lambda kv: -kv[1][1])[:top]
    return {"entries": len(entries), "complete": len(entries) < SLOWLOG_MAX,
            "calls_in_scripts_per_job": round(inside / jobs, 2),
            "top": {k: {"calls": round(c / jobs, 2), "usec": round(u / jobs, 1)} for k, (c, u) in ranked}}


def phase_latency(run: Run, rng: random.Random, k_max: int, rate: float) -> dict[str, object]:
    args = run.args
    run.check_time("latency")
    run.say(f"latency: submitting {args.jobs} jobs at {rate:g}/s on the idle cluster")
    specs = [job_spec(f"steady-{i}", rng.randint(1, k_max), args.job_s) for i in range(args.jobs)]
    profile: dict[str, object] = {}
    if args.redis_profile:
        slowlog_start(run.bench.admin)
    subs = run.submit(specs, rate, "latency submitted")
    ids = [s.job_id for s in subs if s.job_id]
    # (read before the jobs are read back: their GetJob calls are not the jobs' cost)
    jobs = run.wait_and_read(ids, "latency", on_ended=(lambda: profile.update(slowlog_profile(run.bench.admin, len(ids))))
                             if args.redis_profile else None)
    waits = submit_to_running(jobs)
    to_placed, to_running = wait_split(jobs)
    ran_to_end, placed_to_end, gpus_busy = hold_split(jobs)
    lat = submit_latency_ms(subs)
    return {"jobs": len(jobs), "rate_per_s": rate, "offered_rate_per_s": offered_rate(subs),
            "submit_to_running_p50_s": percentile(waits, 50), "submit_to_running_p99_s": percentile(waits, 99),
            "submit_to_running_max_s": max(waits) if waits else None,
            # the two halves: waiting for a placement pass, then the launch through the agent
            "submit_to_placed_p50_s": percentile(to_placed, 50), "submit_to_placed_p99_s": percentile(to_placed, 99),
            "placed_to_running_p50_s": percentile(to_running, 50),
            "placed_to_running_p99_s": percentile(to_running, 99),
            # how long GPUs stay held: the job's own --job-s, then its exit's way back to a release
            "running_to_ended_p50_s": percentile(ran_to_end, 50), "running_to_ended_p99_s": percentile(ran_to_end, 99),
            "placed_to_ended_p50_s": percentile(placed_to_end, 50),
            "gpus_busy_mean": gpus_busy,
            "submit_p50_ms": percentile(lat, 50), "submit_p99_ms": percentile(lat, 99),
            **({"redis_profile": profile} if args.redis_profile else {}),
            **outcome_counts(jobs)}  # fmt: skip


def start_blockers(run: Run) -> list[str]:
    """Jobs of the backlog type only, holding every GPU of it until cancelled. -> their ids."""
    args = run.args
    total = args.backlog_agents * args.gpus_per_agent
    sleep_s = args.timeout_s + 120  # outlives the run; cancelled at its end
    specs = [job_spec(f"blocker-{i}", k, sleep_s, [args.backlog_gpu_type])
             for i, k in enumerate(blocker_sizes(total))]
    run.say(f"backlog: {len(specs)} blocker jobs take all {total} {args.backlog_gpu_type} GPUs")
    ids = [s.job_id for s in run.submit(specs, 0, "blockers submitted", measured=False) if s.job_id]
    started = wait_states(run.bench.admin, run.bench.keys, ids, {"RUNNING"}, run.deadline, run.say, "blockers running")
    if len(started) < len(specs):
        run.problems.append(f"backlog: only {len(started)} of {len(specs)} blockers started")
        raise Deadline("blockers")
    return ids


def phase_backlog(run: Run, blockers: Sequence[str]) -> dict[str, object]:
    args, bench = run.args, run.bench
    run.check_time("backlog")
    run.say(f"backlog: queueing {args.backlog} jobs that may only use {args.backlog_gpu_type} (all held)")
    specs = [job_spec(f"backlog-{i}", 1, args.job_s, [args.backlog_gpu_type]) for i in range(args.backlog)]
    t0 = time.monotonic()
    queued = [s.job_id for s in run.submit(specs, 0, "backlog queued", measured=False) if s.job_id]
    queue_s = time.monotonic() - t0
    run.say("backlog: submitting one 1-GPU job of any type")
    called_at = time.time()  # the scheduler stamps submitted_at inside SubmitJob, after this
    probe_sub = run.submit([job_spec("probe", 1, args.job_s)], 0, "probe submitted")
    probe = run.wait_and_read([s.job_id for s in probe_sub if s.job_id], "backlog probe")
    states = job_states(bench.admin, bench.keys, queued)
    to_running = submit_to_running(probe)
    return {"queued": len(queued), "queue_s": queue_s, "blockers": len(blockers),
            "backlog_new_job_to_running_s": to_running[0] if to_running else None,
            "probe_submit_ms": probe_sub[0].latency_s * 1000.0,
            # as the user sees it: from the SubmitJob call (wall clock, same machine) to RUNNING
            "probe_call_to_running_s": (to_running[0] + probe[0].submitted_at - called_at) if to_running else None,
            "probe_gpu_type": probe[0].plan.gpu_type if probe else None,
            "probe_state": state_name(probe[0]) if probe else None,
            "backlog_started": sum(1 for s in states if s != "PENDING")}  # fmt: skip


def stop_blockers(run: Run, ids: Sequence[str]) -> list[types_pb2.Job]:
    """Hold the queue (the backlog must not start on the freed GPUs), cancel the blockers, wait
    for them to end (30 s at most). -> the blockers as read then."""
    bench = run.bench
    bench.admin.set(bench.keys.queue_hold(), "bench/load.py: the run is over")
    for job_id in ids:
        try:
            bench.stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="bench over"), timeout=30)
        except grpc.RpcError as exc:
            run.errors.add(f"cancel {job_id}: {exc.code().name}")
    wait_states(bench.admin, bench.keys, ids, ENDED, time.monotonic() + 30, run.say, "blockers ended")
    return fetch_jobs(bench.stub, ids)


def run_phases(args: argparse.Namespace, say: callable) -> dict[str, object]:  # type: ignore[valid-type]
    cluster = cluster_of(args)
    k_max = min(MAX_K, args.agents * args.gpus_per_agent)
    blockers_n = len(blocker_sizes(args.backlog_agents * args.gpus_per_agent)) if args.backlog else 0
    raise_service_limits(2 * args.jobs + args.saturation_jobs + args.backlog + blockers_n + 1, args.rate)
    # every service's Python threads name themselves (bench/thread_names): the API's CPU apart
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(THREAD_NAMES), os.environ.get("PYTHONPATH")) if p)
    rng = random.Random(args.seed)
    phases: dict[str, dict] = {}
    out: dict[str, object] = {"bench": "load", **machine(), "split_scheduler": args.split_scheduler}
    with running_stack(cluster, say, keep_logs=args.keep_logs, split_scheduler=args.split_scheduler) as bench:
        run = Run(bench, args, time.monotonic() + args.timeout_s, say)
        cpu0 = service_cpu(bench.stack)
        blockers: list[str] = []
        blocker_jobs: list[types_pb2.Job] = []
        rate = args.rate
        try:
            if args.backlog:
                blockers = start_blockers(run)
            phases["burst"] = run.phase("burst", lambda: phase_burst(run, rng, k_max))
            if args.idle_s > 0:
                phases["idle"] = run.phase("idle", lambda: phase_idle(run), jobs_key=None)
            if args.saturation_jobs:
                phases["saturation"] = run.phase("saturation", lambda: phase_saturation(run, rng, k_max))
                rate = latency_rate(args.rate, phases["saturation"]["saturation_rate_per_s"])
            phases["latency"] = run.phase("latency", lambda: phase_latency(run, rng, k_max, rate))
            if args.backlog:
                phases["backlog"] = run.phase("backlog", lambda: phase_backlog(run, blockers), jobs_key=None)
        except Deadline:
            pass
        finally:
            cpu1 = service_cpu(bench.stack)
            if blockers:
                blocker_jobs = stop_blockers(run, blockers)
        # (the loop's: placements, ticks and latencies are counted where the passes run)
        out["scheduler_metrics"] = scheduler_metrics(bench.stack.metrics_ports.get("scheduler-loop")
                                                     or bench.stack.metrics_port)
        out["redis"] = bench.admin.info("server")["redis_version"]
        startup_s = bench.startup_s
    burst, sat, latency, backlog = (phases.get(p, {}) for p in ("burst", "saturation", "latency", "backlog"))
    counts = outcome_counts(run.measured)
    out.update({
        "placements_per_s": burst.get("placements_per_s"), "placements_per_s_overall": burst.get("placements_per_s_overall"),
        "first_wave": burst.get("first_wave"),
        "saturation_rate_per_s": sat.get("saturation_rate_per_s"),
        "latency_rate_per_s": latency.get("rate_per_s"),
        # the latency phase's (below saturation): CPU ms per job by kind of process, and scheduler + API + Redis
        "cpu_ms_per_job": latency.get("cpu_ms_per_job"),
        "control_plane_cpu_ms_per_job": latency.get("control_plane_cpu_ms_per_job"),
        "idle_cpu_ms_per_s": phases.get("idle", {}).get("idle_cpu_ms_per_s"),
        "submit_to_running_p50_s": latency.get("submit_to_running_p50_s"),
        "submit_to_running_p99_s": latency.get("submit_to_running_p99_s"),
        "submit_p50_ms": latency.get("submit_p50_ms"), "submit_p99_ms": latency.get("submit_p99_ms"),
        "backlog_new_job_to_running_s": backlog.get("backlog_new_job_to_running_s"),
        "submitted": run.submitted, "succeeded": counts["succeeded"], "failed": counts["failed"],
        "cancelled": counts["cancelled"], "lost": run.lost,
        "ran_twice": counts["ran_twice"] + sum(1 for j in blocker_jobs if ran_twice(j)), "refused": run.refused,
        "cpu_s": cpu_delta(cpu0, cpu1), "loadavg_1m_end": round(os.getloadavg()[0], 2), "startup_s": startup_s,
        "sizes": {"agents": args.agents, "gpus_per_agent": args.gpus_per_agent, "gpu_type": args.gpu_type,
                  "gpus": args.agents * args.gpus_per_agent, "jobs": args.jobs, "rate_per_s": args.rate,
                  "saturation_jobs": args.saturation_jobs, "idle_s": args.idle_s,
                  "job_s": args.job_s, "k": [1, k_max], "seed": args.seed, "backlog": args.backlog,
                  "backlog_agents": args.backlog_agents if args.backlog else 0,
                  "backlog_gpu_type": args.backlog_gpu_type if args.backlog else None,
                  "submitters": args.submitters, "timeout_s": args.timeout_s},
        # which jobs ran twice, and how (attempt, history), to tell a re-run from a history quirk
        "ran_twice_jobs": [f"{j.id} {j.spec.name} attempt {j.attempt}: {history_of(j)}"
                           for j in [*run.measured, *blocker_jobs] if ran_twice(j)][:5],
        "phases": phases, "problems": run.problems, "submit_errors": sorted(run.errors)[:5],
        "complete": not run.problems,
    })  # fmt: skip
    return out


def _num(v: object, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def summary(out: dict) -> str:
    """The result for a person to read."""
    s, p = out["sizes"], out["phases"]
    b, lat, bk = p.get("burst", {}), p.get("latency", {}), p.get("backlog", {})
    lines = [
        f"bench/load.py: {s['agents']} agents x {s['gpus_per_agent']} {s['gpu_type']} ({s['gpus']} GPUs), "
        f"{s['jobs']} jobs per phase of 1..{s['k'][1]} GPUs, sleep {s['job_s']:g} s; "
        f"{out['cpus']} CPUs, Python {out['python']}, load {out['loadavg_1m_start']} -> {out['loadavg_1m_end']}",
        f"  burst      {_num(out['placements_per_s'], '.1f')} placements/s in the first wave "
        f"({_num(out['first_wave'], 'd')} jobs), {_num(out['placements_per_s_overall'], '.1f')}/s overall; "
        f"release to first placement {_num(b.get('burst_release_to_first_placement_s'), '.2f')} s",
        f"  saturation {_num(out['saturation_rate_per_s'], '.1f')} jobs/s to RUNNING, sustained; the latency phase at "
        f"{_num(out['latency_rate_per_s'], '.1f')}/s (--rate {s['rate_per_s']:g}, at most half of it)",
        f"  latency    submit to RUNNING p50 {_num(out['submit_to_running_p50_s'], '.2f')} s, "
        f"p99 {_num(out['submit_to_running_p99_s'], '.2f')} s; SubmitJob p50 {_num(out['submit_p50_ms'], '.1f')} ms, "
        f"p99 {_num(out['submit_p99_ms'], '.1f')} ms at {_num(lat.get('offered_rate_per_s'), '.1f')}/s",
    ]
    if out.get("cpu_ms_per_job"):
        lines.append("  CPU ms/job " + ", ".join(f"{k} {_num(v, '.2f')}" for k, v in out["cpu_ms_per_job"].items())
                     + f" (latency phase; control plane {_num(out['control_plane_cpu_ms_per_job'], '.2f')})")
    if bk:
        lines.append(f"  backlog    a new 1-GPU job behind {bk['queued']} queued: RUNNING after "
                     f"{_num(bk['backlog_new_job_to_running_s'], '.2f')} s on {bk['probe_gpu_type']}; "
                     f"{bk['backlog_started']} of the backlog started")
    lines += [
        f"  jobs       {out['succeeded']} of {out['submitted']} succeeded, {out['failed']} failed, "
        f"{out['lost']} lost, {out['ran_twice']} ran twice, {out['refused']} refused",
        "  CPU s      " + ", ".join(f"{k} {v:.1f}" for k, v in out["cpu_s"].items()),
    ]
    lines += [f"  PROBLEM    {msg}" for msg in out["problems"]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=100, help="fake-GPU agent processes (nodes) of --gpu-type")
    ap.add_argument("--gpus-per-agent", type=int, default=8, help="fake GPUs on each agent")
    ap.add_argument("--gpu-type", default="A100-80GB", help="catalog GPU type of the agents' GPUs")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs in the burst, and again in the latency phase")
    ap.add_argument("--rate", type=float, default=100.0, help="submissions a second in the latency phase")
    ap.add_argument("--saturation-jobs", type=int, default=None,
                    help="jobs of the saturation phase, which measures the rate the stack carries; the latency "
                         "phase runs at the lower of --rate and half of it (default: --jobs; 0: no saturation "
                         "phase, the latency phase at --rate)")
    ap.add_argument("--redis-profile", action="store_true",
                    help="log every Redis command in the latency phase (SLOWLOG at 0 us; it costs Redis CPU): "
                         "calls and usec per job by command and by script in phases.latency.redis_profile")
    ap.add_argument("--idle-s", type=float, default=2.0, help="seconds of the idle stack's CPU measured (0: none)")
    ap.add_argument("--job-s", type=float, default=1.0, help="seconds each job runs (sleep)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the jobs' GPU counts")
    ap.add_argument("--backlog", type=int, default=0, help="jobs queued behind held GPUs in phase 3 (0: no phase 3)")
    ap.add_argument("--backlog-gpu-type", default="H100-80GB", help="the held GPUs' type (phase 3)")
    ap.add_argument("--backlog-agents", type=int, default=None, help="nodes of that type (default: --agents)")
    ap.add_argument("--submitters", type=int, default=16, help="client threads calling SubmitJob")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="deadline for all phases, from the stack being up")
    ap.add_argument("--keep-logs", action="store_true", help="keep the run directory (services' and jobs' logs)")
    ap.add_argument("--split-scheduler", action="store_true",
                    help="run the scheduler's API and its placement loop as two processes (--serve api / loop)")
    ap.add_argument("--json", action="store_true", help="one JSON line last on stdout instead of a summary")
    args = ap.parse_args(argv)
    if args.backlog_agents is None:
        args.backlog_agents = args.agents
    if args.saturation_jobs is None:
        args.saturation_jobs = args.jobs
    checks = [(args.agents >= 1, "--agents must be >= 1"), (args.gpus_per_agent >= 1, "--gpus-per-agent must be >= 1"),
              (args.jobs >= 1, "--jobs must be >= 1"), (args.rate > 0, "--rate must be > 0"),
              (args.job_s >= 0, "--job-s must be >= 0"), (args.backlog >= 0, "--backlog must be >= 0"),
              (args.backlog_agents >= 1, "--backlog-agents must be >= 1"),
              (args.saturation_jobs >= 0, "--saturation-jobs must be >= 0"), (args.idle_s >= 0, "--idle-s must be >= 0"),
              (args.submitters >= 1, "--submitters must be >= 1"), (args.timeout_s > 0, "--timeout-s must be > 0")]
    for ok, msg in checks:
        if not ok:
            ap.error(msg)
    for flag, name in (("--gpu-type", args.gpu_type), ("--backlog-gpu-type", args.backlog_gpu_type)):
        try:
            marp.get_gpu(name)
        except marp.MarpError as exc:
            ap.error(f"{flag}: {exc}")
    if args.backlog and args.backlog_gpu_type == args.gpu_type:
        ap.error("--backlog-gpu-type must differ from --gpu-type (the backlog waits for GPUs the probe must not need)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run_phases(args, say_stderr)
    if args.json:
        print(json.dumps(out, separators=(",", ":")))
    else:
        print(summary(out))
    return 0 if out["complete"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
