"""How many jobs a second the whole stack places, and how long a job waits to run, end to end.

One command, JSON on stdout (progress on stderr):

    .venv/bin/python bench/placement_throughput.py                         # 100 agents, 720 GPUs, 1,000 jobs at 50/s
    .venv/bin/python bench/placement_throughput.py --agents 30 --gpus 216 --jobs 300 --rate 50

``bench/scheduler_tick.py`` times one tick against Redis; this times what a user sees. The
local stack (``frenzy.devstack.stack.LocalStack``: a private ``redis-server``, the predictor,
the scheduler and one fake-GPU agent process per node, every service on its own Redis user,
launches and events signed per node, every gRPC call with a bearer token) runs on loopback.
``--gpus`` GPUs of ``--gpu-type`` are spread over ``--agents`` nodes as evenly as whole GPUs
allow. ``--jobs`` small jobs (gpt2-124m, one GPU each: ``limits.max_gpus`` 1, running
``sleep --job-s``) are submitted over gRPC, one call each from a pool of ``--submitters``
threads, started at ``--rate`` a second (0: all at once, a burst). The stack's submission
rate limit and queued-jobs quota are raised above the run's size (``FRENZY_SUBMIT_RATE``,
``FRENZY_SUBMIT_BURST``, ``FRENZY_MAX_QUEUED_PER_USER`` in the services' environment), so
nothing is refused for being a benchmark.

While jobs run, their states are polled straight from Redis (the admin connection, one
pipelined read a second: not through the scheduler, whose time is what is measured). Once
every job has ended (or ``--timeout-s`` passed), each job is read once over gRPC (GetJob)
and the numbers come from its history, stamped by the scheduler:

* ``placements_per_s``: RESERVED transitions / seconds from the first to the last one;
* ``submit_to_running_p50_s`` / ``_p99_s``: the first RUNNING transition minus ``submitted_at``;
* ``submit_p50_ms`` / ``submit_p99_ms``: SubmitJob's round trip as the client saw it;
* ``succeeded``, ``failed``, ``cancelled``, ``lost`` (not ended at the deadline),
  ``ran_twice`` (more than one attempt, or entering RUNNING twice), ``refused`` (SubmitJob errors);
* ``offered_rate_per_s``: the rate submissions really started at;
* ``cpu_s``: CPU seconds (user + system) per service process over the run (agents summed);
* ``scheduler_metrics``: the scheduler's own counts from its Prometheus /metrics at the end
  (placements, submit-to-RUNNING observations and sum, ticks, events by outcome).

Sizes this 2-core machine handles in a few minutes: ``--agents 30 --gpus 216 --jobs 300``.

``bench/load.py`` measures more (a held-then-released burst of 1- to 8-GPU jobs, latency below
saturation, a new job behind a backlog); this script stays for the baseline numbers in
``bench/README.md``, measured with it. Both are built from ``bench/stack_run.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from stack_run import (
    Submission,
    cpu_delta,
    fetch_jobs,
    offered_rate,
    outcome_counts,
    percentile,
    raise_service_limits,
    running_stack,
    say_stderr,
    scheduler_metrics,
    service_cpu,
    submit_all,
    submit_latency_ms,
    submit_to_running,
    wait_ended,
)

from frenzy.v1 import types_pb2
from has.cluster_spec import parse_cluster


def cluster_of(agents: int, gpus: int, gpu_type: str) -> dict:
    """``gpus`` GPUs over ``agents`` nodes: the first ones one GPU more when it does not divide."""
    if agents < 1 or gpus < agents:
        raise SystemExit(f"need --agents >= 1 and --gpus >= --agents (got {agents}, {gpus})")
    per, extra = divmod(gpus, agents)
    groups = []
    if extra:
        groups.append({"gpu": gpu_type, "count": extra, "gpus_per_node": per + 1, "name_prefix": "big"})
    groups.append({"gpu": gpu_type, "count": agents - extra, "gpus_per_node": per, "name_prefix": "node"})
    return {"nodes": groups}


def job_spec(index: int, job_s: float) -> types_pb2.JobSpec:
    """A small one-GPU job that sleeps ``job_s`` seconds."""
    return types_pb2.JobSpec(name=f"bench-{index}", model=types_pb2.ModelSpec(catalog_name="gpt2-124m"),
                             recipe=types_pb2.TrainingRecipe(seq_len=128, global_batch=8),
                             limits=types_pb2.JobLimits(max_gpus=1), command=["sleep", f"{job_s:g}"])


def summarise(jobs: list[types_pb2.Job], subs: list[Submission], lost: int) -> dict:
    reserved_at = [t.at for j in jobs for t in j.history if t.state == types_pb2.JOB_STATE_RESERVED]
    waits = submit_to_running(jobs)
    span = max(reserved_at) - min(reserved_at) if len(reserved_at) > 1 else 0.0
    lat_ms = submit_latency_ms(subs)
    ok = [s for s in subs if s.job_id]
    return {
        "placements": len(reserved_at), "placement_span_s": span,
        "placements_per_s": len(reserved_at) / span if span > 0 else None,
        "submit_to_running_p50_s": percentile(waits, 50), "submit_to_running_p99_s": percentile(waits, 99),
        "submit_to_running_max_s": max(waits) if waits else None,
        "submit_p50_ms": percentile(lat_ms, 50), "submit_p99_ms": percentile(lat_ms, 99),
        "offered_rate_per_s": offered_rate(subs),
        "submitted": len(ok), "refused": len(subs) - len(ok),
        **outcome_counts(jobs), "lost": lost,
    }  # fmt: skip


def run(args: argparse.Namespace, say: callable) -> dict:  # type: ignore[valid-type]
    cluster = parse_cluster(cluster_of(args.agents, args.gpus, args.gpu_type))
    raise_service_limits(args.jobs, args.rate)
    with running_stack(cluster, say, keep_logs=args.keep_logs) as bench:
        cpu0 = service_cpu(bench.stack)
        say(f"submitting {args.jobs} jobs at {args.rate:g}/s" if args.rate > 0 else
            f"submitting {args.jobs} jobs at once")
        t_submit = time.monotonic()
        subs = submit_all(bench.stub, [job_spec(i, args.job_s) for i in range(args.jobs)], args.rate,
                          args.submitters, say)
        submit_s = time.monotonic() - t_submit
        ids = [s.job_id for s in subs if s.job_id]
        ended = wait_ended(bench.admin, bench.keys, ids, args.timeout_s, say)
        run_s = time.monotonic() - t_submit
        cpu1 = service_cpu(bench.stack)
        jobs = fetch_jobs(bench.stub, ids)
        counted = scheduler_metrics(bench.stack.metrics_port)
        version = bench.admin.info("server")["redis_version"]
        startup_s = bench.startup_s
    errors = sorted({s.error for s in subs if s.error})[:5]
    out = summarise(jobs, subs, lost=len(ids) - len(ended))
    out.update({
        "agents": args.agents, "gpus": cluster.total_gpus, "gpu_type": args.gpu_type, "jobs": args.jobs,
        "rate_per_s": args.rate, "job_s": args.job_s, "startup_s": startup_s, "submit_s": submit_s,
        "run_s": run_s, "cpu_s": cpu_delta(cpu0, cpu1),
        "submit_errors": errors, "redis": version, "scheduler_metrics": counted,
    })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=100, help="fake-GPU agent processes (nodes)")
    ap.add_argument("--gpus", type=int, default=720, help="GPUs in all, spread over the agents")
    ap.add_argument("--gpu-type", default="A100-80GB", help="catalog GPU type of every fake GPU")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs to submit (one GPU each)")
    ap.add_argument("--rate", type=float, default=50.0, help="submissions started a second (0: all at once)")
    ap.add_argument("--job-s", type=float, default=1.0, help="seconds each job runs (sleep)")
    ap.add_argument("--submitters", type=int, default=16, help="client threads calling SubmitJob")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="give up waiting for the jobs after this")
    ap.add_argument("--keep-logs", action="store_true", help="keep the run directory (services' and jobs' logs)")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.rate < 0 or args.job_s < 0 or args.submitters < 1:
        ap.error("need --jobs >= 1, --rate >= 0, --job-s >= 0, --submitters >= 1")

    result = run(args, say_stderr)
    out = {"bench": "placement_throughput", "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), **result}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
