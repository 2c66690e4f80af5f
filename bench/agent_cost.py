"""What one job costs its agent, in CPU: the number that bounds placements on a busy node (issue 15).

    .venv/bin/python bench/agent_cost.py --json
    .venv/bin/python bench/agent_cost.py --agents 4 --jobs 400 --job-s 0.2 --idle-s 10

The local stack (``bench/stack_run.py``) on ``--agents`` fake-GPU nodes of 8 GPUs. First the
agents sit idle for ``--idle-s`` seconds: ``idle_cpu_ms_per_agent_s`` is what an agent with
nothing to do spends a second (heartbeats, the stream read, the log shipper, the metrics
listener). Then ``--jobs`` one-GPU gpt2-124m jobs that run ``sleep --job-s`` go through the
stack, and the agents' CPU over that phase, less the idle rate times its length, is divided by
the jobs: ``agent_ms_per_job`` is the agent process itself (launch, watching, reports, log
shipping, the ledger), ``children_ms_per_job`` its children's (the spawner, the jobs' shims and their commands: a
``sleep`` costs about 1 ms, so this is mostly the shims). CPU comes from /proc (utime+stime,
cutime+cstime of the agents). Prints one JSON line last with ``--json``.

The jobs are the benchmark's own choice (a sleep, not training): the number is the agent's
overhead per job, which a real job's minutes of GPU time dwarf, but which decides how many
short jobs a second a node can start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack_run import (  # noqa: E402
    cpu_split,
    fetch_jobs,
    live_children,
    machine,
    raise_service_limits,
    running_stack,
    say_stderr,
    submit_all,
    wait_ended,
)

from frenzy.v1 import types_pb2  # noqa: E402
from has.cluster_spec import parse_cluster  # noqa: E402


def agents_cpu(stack) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(the agents' own CPU, their children's): reaped children, and the live ones (the spawner,
    which reaps the shims and so holds their CPU and their commands')."""
    own = kids = 0.0
    for svc in stack.services:
        if svc.name.startswith("agent-"):
            o, k = cpu_split(svc.proc.pid)
            own, kids = own + o, kids + k
            for child in live_children(svc.proc.pid):
                co, ck = cpu_split(child)
                kids += co + ck
    return own, kids


def spec(i: int, job_s: float) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(
        name=f"cost-{i}", model=types_pb2.ModelSpec(catalog_name="gpt2-124m"),
        recipe=types_pb2.TrainingRecipe(seq_len=128, global_batch=8, micro_batch=1, train_steps=10),
        limits=types_pb2.JobLimits(min_gpus=1, max_gpus=1), command=["sleep", f"{job_s:g}"])  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, object]:
    say = say_stderr if not args.quiet else (lambda _m: None)
    cluster = parse_cluster({"nodes": [{"gpu": args.gpu_type, "count": args.agents, "gpus_per_node": 8,
                                        "name_prefix": "node"}]})
    load_before = os.getloadavg()[0]
    raise_service_limits(args.jobs, args.rate)  # a benchmark is not refused by the per-user rate limit
    with running_stack(cluster, say) as bench:
        time.sleep(2.0)  # let the agents finish registering and importing
        own0, kids0 = agents_cpu(bench.stack)
        t0 = time.monotonic()
        time.sleep(args.idle_s)
        own1, kids1 = agents_cpu(bench.stack)
        idle_s = time.monotonic() - t0
        idle_rate = (own1 - own0) / idle_s  # CPU-s per s, all agents
        say(f"idle: {1000 * idle_rate / args.agents:.1f} ms of CPU per agent per second")
        t1 = time.monotonic()
        subs = submit_all(bench.stub, [spec(i, args.job_s) for i in range(args.jobs)], args.rate,
                          threads=8, say=say)
        ids = [s.job_id for s in subs if s.job_id]
        ended = wait_ended(bench.admin, bench.keys, ids, args.timeout_s, say)
        own2, kids2 = agents_cpu(bench.stack)
        busy_s = time.monotonic() - t1
        jobs = fetch_jobs(bench.stub, ids)
    succeeded = sum(1 for j in jobs if j.state == types_pb2.JOB_STATE_SUCCEEDED)
    n = max(1, len(ids))
    agent_ms = 1000 * ((own2 - own1) - idle_rate * busy_s) / n
    return {
        "agents": args.agents, "jobs": args.jobs, "job_s": args.job_s, "rate": args.rate,
        "submitted": len(ids), "ended": len(ended), "succeeded": succeeded,
        "idle_cpu_ms_per_agent_s": round(1000 * idle_rate / args.agents, 2),
        "agent_ms_per_job": round(agent_ms, 2),
        "children_ms_per_job": round(1000 * (kids2 - kids1) / n, 2),
        "busy_phase_s": round(busy_s, 2),
        "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=4, help="fake-GPU agent processes of 8 GPUs each")
    ap.add_argument("--gpu-type", default="A100-80GB", help="their catalog GPU type")
    ap.add_argument("--jobs", type=int, default=400, help="one-GPU jobs to run through the agents")
    ap.add_argument("--job-s", type=float, default=0.2, help="seconds each job sleeps")
    ap.add_argument("--rate", type=float, default=50.0, help="submissions a second (0: all at once)")
    ap.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle agents measured first")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="deadline for the jobs to end")
    ap.add_argument("--json", action="store_true", help="one JSON line last on stdout")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    out = run(args)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>26}: {v}")
    return 0 if out["succeeded"] == out["submitted"] else 1


if __name__ == "__main__":
    sys.exit(main())
