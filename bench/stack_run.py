"""What the whole-stack benchmarks share: the local stack on loopback, submissions over gRPC,
waiting for jobs to end, and reading what happened from the jobs' histories and the processes.

``bench/load.py`` (burst, latency and backlog phases) and ``bench/placement_throughput.py``
(one stream of one-GPU jobs) are built from these pieces; neither is imported by the product.
The stack is ``frenzy.devstack.stack.LocalStack``: a private ``redis-server``, the predictor,
the scheduler and one fake-GPU agent process per node, every service on its own Redis user,
launches and events signed per node, every gRPC call with a bearer token. Job states are
polled straight from Redis with the admin connection (one pipelined read every half second),
not through the scheduler, whose time is what is measured; the numbers come from each job's
history as the scheduler stamped it, read once over gRPC (GetJob) after the jobs ended.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
from has.cluster_spec import ClusterSpec

ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}
Say = Callable[[str], None]


def say_stderr(msg: str) -> None:
    """Progress goes to stderr, so stdout holds only the result."""
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Submission:
    index: int
    job_id: str  # "" when SubmitJob failed
    started: float  # time.monotonic() at the call
    latency_s: float
    error: str = ""


@dataclass
class BenchStack:
    """A started stack and the clients a benchmark drives it with."""

    stack: LocalStack
    admin: redis.Redis  # the operator's connection (decode_responses=True)
    keys: Keys
    stub: scheduler_pb2_grpc.SchedulerStub  # every call carries the stack's admin token
    startup_s: float


def raise_service_limits(submissions: int, rate: float) -> None:
    """The stack's services read their per-user submission rate and queued-jobs quota from the
    environment: a benchmark user may submit the whole run at once, at any rate, so nothing is
    refused for being a benchmark. Call before the stack starts."""
    os.environ.update(FRENZY_SUBMIT_RATE=str(max(1000.0, 10 * rate)),
                      FRENZY_SUBMIT_BURST=str(max(1000, 2 * submissions)),
                      FRENZY_MAX_QUEUED_PER_USER=str(max(1000, 2 * submissions)))


@contextmanager
def running_stack(cluster: ClusterSpec, say: Say, keep_logs: bool = False,
                  split_scheduler: bool = False) -> Iterator[BenchStack]:
    """Start the local stack on ``cluster`` (no batch worker), yield it with an admin Redis client
    and a token-carrying scheduler stub, and stop it (and remove its run directory unless
    ``keep_logs``) however the block ends. ``split_scheduler``: the API and the placement loop in
    two processes (``frenzy scheduler --serve api`` / ``--serve loop``)."""
    run_dir = tempfile.mkdtemp(prefix="frenzy-bench-")
    stack = LocalStack.create(cluster, run_dir=run_dir, with_worker=False, split_scheduler=split_scheduler)
    say(f"starting the stack: {len(cluster.nodes())} agents, {cluster.total_gpus} fake GPUs (run dir {run_dir})")
    t0 = time.monotonic()
    admin = None
    try:
        # (the private Redis's admin password stays out of the output)
        stack.start(progress=lambda msg: say("  " + re.sub(r"://[^@/]*@", "://***@", msg)))
        admin = redis.Redis.from_url(stack.redis_url, decode_responses=True)
        with grpc.insecure_channel(stack.scheduler_addr) as raw:
            stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, stack.token))
            yield BenchStack(stack, admin, Keys(stack.prefix), stub, time.monotonic() - t0)
    finally:
        if admin is not None:
            admin.close()
        stack.stop()
        if not keep_logs:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            say(f"logs kept in {run_dir}")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def cpu_split(pid: int) -> tuple[float, float]:
    """(own, waited-for children's) user + system CPU seconds of a live process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tck = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tck, (int(fields[13]) + int(fields[14])) / tck


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process and its waited-for children, from /proc."""
    return sum(cpu_split(pid))


def live_children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux /proc/PID/task/*/children)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            kids += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except (OSError, ValueError):
        pass
    return kids


def service_cpu(stack: LocalStack) -> dict[str, float]:
    """CPU seconds so far per service process (the agents summed) and Redis. An agent's count
    includes its live children's: its spawner, which reaps the jobs' shims and so holds their
    CPU and their commands' (an exec'd shim's the agent reaps itself)."""
    out: dict[str, float] = {}
    for svc in stack.services:
        name = "agents" if svc.name.startswith("agent-") else svc.name
        cpu = cpu_seconds(svc.proc.pid)
        if name == "agents":
            cpu += sum(cpu_seconds(child) for child in live_children(svc.proc.pid))
        out[name] = out.get(name, 0.0) + cpu
    if stack.redis is not None and stack.redis.proc is not None:
        out["redis"] = cpu_seconds(stack.redis.proc.pid)
    # The benchmark's own process (its gRPC clients, its polling of job states): it shares the
    # machine with what it measures.
    own = resource.getrusage(resource.RUSAGE_SELF)
    out["load_generator"] = own.ru_utime + own.ru_stime
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 2) for k in sorted(after)}


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


def machine() -> dict[str, object]:
    """What ran the benchmark: the numbers only compare on the same machine and load."""
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "loadavg_1m_start": round(os.getloadavg()[0], 2)}


def submit_all(stub: scheduler_pb2_grpc.SchedulerStub, specs: Sequence[types_pb2.JobSpec], rate: float,
               threads: int, say: Say, label: str = "submitted") -> list[Submission]:
    """Start one SubmitJob every 1/``rate`` s (0: all at once) from a pool of ``threads``;
    progress every tenth of the jobs. -> one Submission per spec, in the specs' order."""
    done: list[Submission] = []
    lock = threading.Lock()
    total = len(specs)

    def one(i: int) -> None:
        t0 = time.monotonic()
        try:
            resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=specs[i]), timeout=120)
            sub = Submission(i, resp.job.id, t0, time.monotonic() - t0)
        except grpc.RpcError as exc:
            sub = Submission(i, "", t0, time.monotonic() - t0, f"{exc.code().name}: {exc.details()}")
        with lock:
            done.append(sub)
            if len(done) % max(1, total // 10) == 0 or len(done) == total:
                say(f"  {label} {len(done)}/{total}")

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for i in range(total):
            if rate > 0:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            pool.submit(one, i)
    return sorted(done, key=lambda s: s.index)


def job_states(client: redis.Redis, keys: Keys, job_ids: Sequence[str]) -> list[str | None]:
    """The jobs' states as stored, in one pipelined read."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), "state")
    return pipe.execute()


def wait_states(client: redis.Redis, keys: Keys, job_ids: Sequence[str], wanted: set[str], deadline: float,
                say: Say, what: str = "ended") -> set[str]:
    """Poll the jobs' states in Redis until each is in ``wanted`` (or, for ``wanted`` = ENDED,
    has ended) or ``deadline`` (time.monotonic()). -> the jobs that got there."""
    reached: set[str] = set()
    last_said = time.monotonic()
    while True:
        left = [j for j in job_ids if j not in reached]
        if not left:
            break
        states = job_states(client, keys, left)
        reached |= {j for j, s in zip(left, states, strict=True) if s in wanted}
        if time.monotonic() >= deadline:
            break
        if time.monotonic() - last_said >= 5:
            last_said = time.monotonic()
            running = sum(1 for s in states if s == "RUNNING")
            say(f"  {what} {len(reached)}/{len(job_ids)}, running {running}")
        time.sleep(0.5)
    return reached


def wait_ended(client: redis.Redis, keys: Keys, job_ids: Sequence[str], timeout_s: float, say: Say) -> set[str]:
    """Poll until every job has ended or ``timeout_s`` passed. -> the ended ones."""
    return wait_states(client, keys, job_ids, ENDED, time.monotonic() + timeout_s, say)


def fetch_jobs(stub: scheduler_pb2_grpc.SchedulerStub, job_ids: Sequence[str]) -> list[types_pb2.Job]:
    """Each job as the API shows it (history included), one GetJob each."""
    return [stub.GetJob(scheduler_pb2.GetJobRequest(job_id=j), timeout=30) for j in job_ids]


def state_name(job: types_pb2.Job) -> str:
    return types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")


ENDED_STATES = frozenset({types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED})


def first_at(job: types_pb2.Job, state: int) -> float | None:
    """When the job first entered ``state`` (a JobState number), from its history."""
    return next((t.at for t in job.history if t.state == state), None)


def times_entered(job: types_pb2.Job, state: int) -> int:
    """How often the job's history enters ``state``. A history entry that repeats the state before
    it is a note, not a transition (a cancel request is logged with the job's current state)."""
    entered, before = 0, None
    for t in job.history:
        if t.state == state and before != state:
            entered += 1
        before = t.state
    return entered


def ran_twice(job: types_pb2.Job) -> bool:
    """More than one attempt, or entered RUNNING more than once: work done twice."""
    return job.attempt > 1 or times_entered(job, types_pb2.JOB_STATE_RUNNING) > 1


def history_of(job: types_pb2.Job) -> str:
    """The job's history in one line (``PENDING@0.000 RESERVED@0.412 ...``, seconds after submission)."""
    return " ".join(f"{types_pb2.JobState.Name(t.state).removeprefix('JOB_STATE_')}@{t.at - job.submitted_at:.3f}"
                    for t in job.history)


def submit_to_running(jobs: Sequence[types_pb2.Job]) -> list[float]:
    """Per job that ran: its first RUNNING transition minus ``submitted_at`` (both stamped by the scheduler)."""
    out = []
    for j in jobs:
        at = first_at(j, types_pb2.JOB_STATE_RUNNING)
        if at is not None:
            out.append(at - j.submitted_at)
    return out


def wait_split(jobs: Sequence[types_pb2.Job]) -> tuple[list[float], list[float]]:
    """Where submit-to-RUNNING went, per job that ran: (submitted -> placed: waiting for a pass,
    placed -> RUNNING: the launch through the agent and its RUNNING event). Placed is the first
    RESERVED or LAUNCHING transition (a batched placement goes straight to LAUNCHING)."""
    queued, launch = [], []
    for j in jobs:
        ran = first_at(j, types_pb2.JOB_STATE_RUNNING)
        placed = [t for t in (first_at(j, types_pb2.JOB_STATE_RESERVED), first_at(j, types_pb2.JOB_STATE_LAUNCHING))
                  if t is not None]
        if ran is not None and placed:
            queued.append(min(placed) - j.submitted_at)
            launch.append(ran - min(placed))
    return queued, launch


def hold_split(jobs: Sequence[types_pb2.Job]) -> tuple[list[float], list[float], float | None]:
    """How long each job that ran held its GPUs: (RUNNING -> ended: its own run plus the exit's
    report through its agent and the scheduler's release; placed -> ended), and the GPUs they
    kept busy on average (GPU-seconds held over the span from the first placement to the last
    end): near the cluster's size, new jobs wait for capacity, not for the scheduler."""
    ran_to_end, placed_to_end, gpu_s = [], [], 0.0
    first, last = float("inf"), float("-inf")
    for j in jobs:
        ran = first_at(j, types_pb2.JOB_STATE_RUNNING)
        ends = [t.at for t in j.history if t.state in ENDED_STATES]
        placed = [t for t in (first_at(j, types_pb2.JOB_STATE_RESERVED), first_at(j, types_pb2.JOB_STATE_LAUNCHING))
                  if t is not None]
        if ran is None or not ends or not placed:
            continue
        ran_to_end.append(ends[0] - ran)
        placed_to_end.append(ends[0] - min(placed))
        gpu_s += (ends[0] - min(placed)) * sum(len(a.gpu_indices) for a in j.placement)
        first, last = min(first, min(placed)), max(last, ends[0])
    return ran_to_end, placed_to_end, gpu_s / (last - first) if last > first else None


def submit_latency_ms(subs: Sequence[Submission]) -> list[float]:
    """SubmitJob's round trip as the client saw it, for the calls that succeeded."""
    return [s.latency_s * 1000.0 for s in subs if s.job_id]


def offered_rate(subs: Sequence[Submission]) -> float | None:
    """The rate submissions really started at (a slow SubmitJob can hold the client pool back)."""
    starts = [s.started for s in subs]
    if len(starts) < 2 or max(starts) <= min(starts):
        return None
    return (len(starts) - 1) / (max(starts) - min(starts))


def outcome_counts(jobs: Sequence[types_pb2.Job]) -> dict[str, int]:
    states = [state_name(j) for j in jobs]
    return {"succeeded": states.count("SUCCEEDED"), "failed": states.count("FAILED"),
            "cancelled": states.count("CANCELLED"), "ran_twice": sum(1 for j in jobs if ran_twice(j))}
