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
  ``ran_twice`` (more than one attempt, or RUNNING twice), ``refused`` (SubmitJob errors);
* ``offered_rate_per_s``: the rate submissions really started at;
* ``cpu_s``: CPU seconds (user + system) per service process over the run (agents summed);
* ``scheduler_metrics``: the scheduler's own counts from its Prometheus /metrics at the end
  (placements, submit-to-RUNNING observations and sum, ticks, events by outcome).

Sizes this 2-core machine handles in a few minutes: ``--agents 30 --gpus 216 --jobs 300``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from frenzy.devstack.stack import LocalStack
from frenzy.rpc.auth import with_token
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from has.cluster_spec import parse_cluster

ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


@dataclass(frozen=True)
class Submission:
    index: int
    job_id: str  # "" when SubmitJob failed
    started: float  # time.monotonic() at the call
    latency_s: float
    error: str = ""


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


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (and its waited-for children), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def service_cpu(stack: LocalStack) -> dict[str, float]:
    out: dict[str, float] = {}
    for svc in stack.services:
        name = "agents" if svc.name.startswith("agent-") else svc.name
        out[name] = out.get(name, 0.0) + cpu_seconds(svc.proc.pid)
    if stack.redis is not None and stack.redis.proc is not None:
        out["redis"] = cpu_seconds(stack.redis.proc.pid)
    return out


def scheduler_metrics(port: int) -> dict[str, float]:
    """The scheduler's counters from its /metrics (what a Prometheus would scrape)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    wanted = {"frenzy_placements_total", "frenzy_reservation_conflicts_total",
              "frenzy_job_submit_to_running_seconds_count", "frenzy_job_submit_to_running_seconds_sum",
              "frenzy_scheduler_tick_seconds_count", "frenzy_scheduler_tick_seconds_sum", "frenzy_agent_events_total"}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in wanted:
                key = s.name + "".join(f"_{v}" for v in s.labels.values())
                out[key] = s.value
    return out


def submit_all(stub: scheduler_pb2_grpc.SchedulerStub, jobs: int, rate: float, job_s: float, threads: int,
               say: callable) -> list[Submission]:  # type: ignore[valid-type]
    """Start one SubmitJob every 1/``rate`` s (0: all at once) from a pool of ``threads``."""
    done: list[Submission] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        t0 = time.monotonic()
        try:
            resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec(i, job_s)), timeout=120)
            sub = Submission(i, resp.job.id, t0, time.monotonic() - t0)
        except grpc.RpcError as exc:
            sub = Submission(i, "", t0, time.monotonic() - t0, f"{exc.code().name}: {exc.details()}")
        with lock:
            done.append(sub)
            if len(done) % max(1, jobs // 10) == 0:
                say(f"  submitted {len(done)}/{jobs}")

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for i in range(jobs):
            if rate > 0:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            pool.submit(one, i)
    return sorted(done, key=lambda s: s.index)


def wait_ended(client: redis.Redis, keys: Keys, job_ids: list[str], timeout_s: float,
               say: callable) -> set[str]:  # type: ignore[valid-type]
    """Poll the jobs' states in Redis until all have ended or the deadline. -> the ended ones."""
    deadline = time.monotonic() + timeout_s
    ended: set[str] = set()
    last_said = 0.0
    while time.monotonic() < deadline:
        left = [j for j in job_ids if j not in ended]
        if not left:
            break
        pipe = client.pipeline(transaction=False)
        for job_id in left:
            pipe.hget(keys.job(job_id), "state")
        states = pipe.execute()
        ended |= {j for j, s in zip(left, states, strict=True) if s in ENDED}
        if time.monotonic() - last_said >= 5:
            last_said = time.monotonic()
            running = sum(1 for s in states if s == "RUNNING")
            say(f"  ended {len(ended)}/{len(job_ids)}, running {running}")
        time.sleep(0.5)
    return ended


def summarise(jobs: list[types_pb2.Job], subs: list[Submission], lost: int) -> dict:
    name = types_pb2.JobState.Name
    reserved_at = [t.at for j in jobs for t in j.history if t.state == types_pb2.JOB_STATE_RESERVED]
    waits = []
    ran_twice = 0
    for j in jobs:
        running = [t.at for t in j.history if t.state == types_pb2.JOB_STATE_RUNNING]
        if running:
            waits.append(running[0] - j.submitted_at)
        if j.attempt > 1 or len(running) > 1:
            ran_twice += 1
    span = max(reserved_at) - min(reserved_at) if len(reserved_at) > 1 else 0.0
    ok = [s for s in subs if s.job_id]
    starts = [s.started for s in subs]
    offered = (len(starts) - 1) / (max(starts) - min(starts)) if len(starts) > 1 and max(starts) > min(starts) else None
    lat_ms = [s.latency_s * 1000.0 for s in ok]
    states = [name(j.state).removeprefix("JOB_STATE_") for j in jobs]
    return {
        "placements": len(reserved_at), "placement_span_s": span,
        "placements_per_s": len(reserved_at) / span if span > 0 else None,
        "submit_to_running_p50_s": percentile(waits, 50), "submit_to_running_p99_s": percentile(waits, 99),
        "submit_to_running_max_s": max(waits) if waits else None,
        "submit_p50_ms": percentile(lat_ms, 50), "submit_p99_ms": percentile(lat_ms, 99),
        "offered_rate_per_s": offered,
        "submitted": len(ok), "refused": len(subs) - len(ok),
        "succeeded": states.count("SUCCEEDED"), "failed": states.count("FAILED"),
        "cancelled": states.count("CANCELLED"), "lost": lost, "ran_twice": ran_twice,
    }  # fmt: skip


def run(args: argparse.Namespace, say: callable) -> dict:  # type: ignore[valid-type]
    cluster = parse_cluster(cluster_of(args.agents, args.gpus, args.gpu_type))
    # The stack's services read these from their environment: a benchmark user may submit
    # the whole run at once, at any rate.
    os.environ.update(FRENZY_SUBMIT_RATE=str(max(1000.0, 10 * args.rate)),
                      FRENZY_SUBMIT_BURST=str(max(1000, 2 * args.jobs)),
                      FRENZY_MAX_QUEUED_PER_USER=str(max(1000, 2 * args.jobs)))
    run_dir = tempfile.mkdtemp(prefix="frenzy-bench-")
    stack = LocalStack.create(cluster, run_dir=run_dir, with_worker=False)
    t0 = time.monotonic()
    say(f"starting the stack: {args.agents} agents, {cluster.total_gpus} fake {args.gpu_type} GPUs (run dir {run_dir})")
    try:
        # (the private Redis's admin password stays out of the output)
        stack.start(progress=lambda msg: say("  " + re.sub(r"://[^@/]*@", "://***@", msg)))
        startup_s = time.monotonic() - t0
        cpu0 = service_cpu(stack)
        admin = redis.Redis.from_url(stack.redis_url, decode_responses=True)
        keys = Keys(stack.prefix)
        with grpc.insecure_channel(stack.scheduler_addr) as raw:
            stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, stack.token))
            say(f"submitting {args.jobs} jobs at {args.rate:g}/s" if args.rate > 0 else
                f"submitting {args.jobs} jobs at once")
            t_submit = time.monotonic()
            subs = submit_all(stub, args.jobs, args.rate, args.job_s, args.submitters, say)
            submit_s = time.monotonic() - t_submit
            ids = [s.job_id for s in subs if s.job_id]
            ended = wait_ended(admin, keys, ids, args.timeout_s, say)
            run_s = time.monotonic() - t_submit
            cpu1 = service_cpu(stack)
            jobs = [stub.GetJob(scheduler_pb2.GetJobRequest(job_id=j), timeout=30) for j in ids]
        counted = scheduler_metrics(stack.metrics_port)
        version = admin.info("server")["redis_version"]
        admin.close()
        errors = sorted({s.error for s in subs if s.error})[:5]
    finally:
        stack.stop()
    if not args.keep_logs:
        shutil.rmtree(run_dir, ignore_errors=True)
    out = summarise(jobs, subs, lost=len(ids) - len(ended))
    out.update({
        "agents": args.agents, "gpus": cluster.total_gpus, "gpu_type": args.gpu_type, "jobs": args.jobs,
        "rate_per_s": args.rate, "job_s": args.job_s, "startup_s": startup_s, "submit_s": submit_s,
        "run_s": run_s, "cpu_s": {k: round(cpu1.get(k, 0.0) - cpu0.get(k, 0.0), 2) for k in sorted(cpu1)},
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

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result = run(args, say)
    out = {"bench": "placement_throughput", "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), **result}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
