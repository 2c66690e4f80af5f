"""What the live scheduler service spends per tick at scale, phase by phase, against a real Redis.

One command, JSON on stdout (progress on stderr):

    .venv/bin/python bench/scheduler_tick.py                      # 1,000 and 10,000 GPUs
    .venv/bin/python bench/scheduler_tick.py --sizes 1000 --reps 21

``bench/has_decision.py`` times the decision alone, on a view and queue already in memory.
A tick of the service (``SchedulerLoop.tick``) first reads both from Redis, so this script
times what it adds: a private ``redis-server`` (``frenzy.devstack.redis_server``, free port,
stopped at the end, also on error) holding the state the service would see, and one
``StateStore`` reading it as the loop does.

State per size (the same as ``has.sim.scale.build_state``: ``cluster_of()``'s GPU mix, about
60 % of the GPUs held by running jobs placed by HAS, 1,000 queued jobs from
``has.sim.traces.synthetic`` with MARP's ranked plans from the simulator):

* every node registered with the agent's own ``register_node`` script and the arguments the
  agent passes (all 13 GPU fields; lease TTL 10 min, as nothing heartbeats), pipelined;
* each running job's GPUs carry ``owner`` / ``fence`` as ``place_jobs.lua`` writes them, and
  the job hash what a reservation writes (state RUNNING, plan, placement, fence, master
  node/port) plus ``est_end``, as the loop sets it (the simulator's estimated end, moved onto
  the wall clock);
* each queued job submitted through ``StateStore.submit`` with its plans as the predictor
  sends them (``plan_to_proto`` of each MARP plan), ``completion_s`` set to the simulator's
  runtime estimate (steps left x step time: what ``plan_to_option`` turns into
  ``runtime_s``) and ``gpu_hours`` to match; checked: ``queue()`` gives back the 1,000 jobs
  with the same plans and runtimes, ``cluster()`` the expected free and busy GPUs.

Timed, ``--reps`` ticks per size, each phase separately and the three in sequence:

* ``queue``: ``StateStore.queue()``;
* ``cluster``: ``StateStore.cluster()``;
* ``schedule``: ``has.schedule(cluster, queue, now, QueuePolicy.frenzy(explain=False))``
  (the ticks between two explained ones);
* ``tick``: those three back to back, without the reservations that would follow (no side
  effects, so every tick sees comparable state);
* ``cluster_full_read`` (after the ticks, not part of them): ``StateStore.cluster()`` when its
  periodic full read is due (every ``full_read_s``, 30 s): every GPU read, not only the nodes
  whose ``rev`` moved.

Before each timed tick the state moves a little, as on a live cluster: one running job ends
(its GPUs' owner cleared and its nodes' ``rev`` bumped, as ``transition_job`` does), a free
GPU on another node gets an owner (a new running job with an ``est_end``; ``rev`` bumped), another running job's ``est_end`` moves, one
queued job leaves the queue (cancelled) and one new job is submitted. After every tick the
script checks the view and the queue against what it wrote (free count, the GPUs that changed
hands, the moved ``est_end``, queue length, the job that left and the one that came), so a
cache that misses an invalidation fails the run instead of reporting a fast stale tick.

Output: one row per size and phase with median / min / max ms over the timed ticks and
``cold_ms``, the first tick after the store is created (nothing cached yet, as after a
scheduler restart; not counted in the repetitions); the counts (GPUs, nodes, busy GPUs at the
start and after the last tick, running and queued jobs, plans per job, placements the pass
made); per size, the set-up times. ``cpu_ref_us``: median µs of ``sum(range(1000))`` before
the run (``cpu_ref_us_end``: after it; apart when the machine was busy meanwhile), so numbers
from different machines can be compared. ``--big-reps`` lowers the repetitions for sizes of
5,000 GPUs and more; ``notes`` says when it did.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections import defaultdict

import redis
from google.protobuf import json_format

import marp
from frenzy.devstack.redis_server import start_redis
from frenzy.rpc.convert import plan_to_proto
from frenzy.state import scripts
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.store import StateStore, history_entry
from frenzy.v1 import types_pb2
from has import ClusterView, PlanOption, QueuedJob, QueuePolicy, schedule
from has.sim.baselines import FrenzyPolicy
from has.sim.engine import JobInfo, Simulator
from has.sim.scale import build_state, cluster_of

PHASES = ("queue", "cluster", "schedule", "tick")
LEASE_MS = 600_000  # nothing heartbeats during the run: the nodes must stay alive
NODE_BATCH = 64  # nodes per pipeline while registering
NVML_NAMES = {"H100-80GB": "NVIDIA H100 80GB HBM3", "A100-80GB": "NVIDIA A100-SXM4-80GB",
              "A100-40GB": "NVIDIA A100-SXM4-40GB", "L4": "NVIDIA L4"}  # fmt: skip
NVLINK = {"H100-80GB": "NV18", "A100-80GB": "NV12", "A100-40GB": "NV12"}  # else PCIe host bridge


def cpu_ref_us(runs: int = 11) -> float:
    """Median µs of one ``sum(range(1000))``, over ``runs`` batches of 1,000 calls."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(1000):
            sum(range(1000))
        out.append((time.perf_counter() - t0) * 1e6 / 1000)
    return statistics.median(out)


# ---- state -------------------------------------------------------------------------------


def register_nodes(client: redis.Redis, keys: Keys, view: ClusterView) -> None:
    """Every node and GPU as the agent registers them (its script, its arguments), pipelined."""
    script = scripts.register(client, "register_node")
    nodes = view.nodes
    for start in range(0, len(nodes), NODE_BATCH):
        pipe = client.pipeline(transaction=False)
        for node in nodes[start:start + NODE_BATCH]:
            types = list(dict.fromkeys(g.gpu_type for g in node.gpus))
            args: list[object] = [node.name, "10.0.0.1", ",".join(types), 4242, LEASE_MS, f"bench-{node.name}", "", ""]
            for g in node.gpus:
                link = NVLINK.get(g.gpu_type, "PHB")
                links = {str(p.index): link for p in node.gpus if p.index != g.index}
                busy = g.owner is not None
                args += [g.index, f"GPU-{node.name}-{g.index:02d}", g.gpu_type, NVML_NAMES.get(g.gpu_type, g.gpu_type),
                         g.memory_total, g.memory_free, 1, "", f"00000000:{0x18 + 16 * g.index:02X}:00.0",
                         json.dumps(dict(sorted(links.items()))), 97 if busy else 0,
                         json.dumps([[100_000 + g.index, g.memory_total - g.memory_free]] if busy else []), 0]
            keys_ = [keys.node(node.name), keys.nodes(), keys.node_alive(node.name),
                     *[keys.gpu(node.name, g.index) for g in node.gpus]]
            script(keys=keys_, args=args, client=pipe)
        pipe.execute()


def placement_of(gpus: tuple[tuple[str, int], ...]) -> list[list]:
    by_node: dict[str, list[int]] = defaultdict(list)
    for node, idx in gpus:
        by_node[node].append(idx)
    return [[n, sorted(i)] for n, i in by_node.items()]


def write_running(client: redis.Redis, keys: Keys, sim: Simulator, sim_now: float, wall: float) -> dict[str, float]:
    """Owner and fence on each running job's GPUs, and its job hash as a reservation leaves it
    (RUNNING, with ``est_end``). -> job id -> est_end (wall clock)."""
    ends = {}
    pipe = client.pipeline(transaction=False)
    for fence, job_id in enumerate(sorted(sim.running), start=1):
        info = sim.info[job_id]
        placement = placement_of(info.gpus)
        master = placement[0][0]
        port = 29500 + sum(1 for j in ends if sim.info[j].gpus[0][0] == master)
        plan = plan_to_proto(info.profile.plans[info.plan_index])
        ends[job_id] = wall + (info.est_end - sim_now)
        for node, idx in info.gpus:
            pipe.hset(keys.gpu(node, idx), mapping={"owner": job_id, "fence": fence})
        for node, _ in placement:
            pipe.hincrby(keys.node(node), "rev", 1)  # as place_jobs.lua does
        pipe.hset(keys.ports(master), port, job_id)
        pipe.hset(keys.job(job_id), mapping={
            "id": job_id, "name": job_id, "state": JobState.RUNNING.value, "seq": fence, "attempt": 1,
            "submitted_at": repr(wall - 60), "updated_at": repr(wall), "model_name": info.model,
            "plan": json_format.MessageToJson(plan, indent=None), "placement": json.dumps(placement),
            "fence": fence, "pending_reason": "", "master_node": master, "master_addr": "10.0.0.1",
            "master_port": port, "est_end": repr(ends[job_id]),
        })  # fmt: skip
        pipe.rpush(keys.job_history(job_id), history_entry(JobState.RUNNING, "bench", wall))
        pipe.zadd(keys.jobs(), {job_id: wall - 60})
    pipe.set(keys.seq(), len(sim.running))
    pipe.execute()
    return ends


def plans_of(info: JobInfo) -> list[types_pb2.Plan]:
    """The job's ranked plans as the predictor sends them, with the simulator's runtime estimate."""
    out = []
    for p in info.profile.plans:
        pb = plan_to_proto(p)
        pb.completion_s = FrenzyPolicy.option(p, info).runtime_s
        pb.gpu_hours = pb.completion_s * pb.num_gpus / 3600.0
        out.append(pb)
    return out


def submit(store: StateStore, sim: Simulator, job_id: str) -> str:
    """Submit the simulator's job ``job_id`` through the store, as the service does. -> the new id"""
    info, trace = sim.info[job_id], sim.trace[job_id]
    spec = types_pb2.JobSpec(
        name=job_id, model=types_pb2.ModelSpec(catalog_name=info.model),
        recipe=types_pb2.TrainingRecipe(seq_len=trace.seq_len, global_batch=trace.global_batch,
                                        train_steps=int(info.steps_left)),
        command=["torchrun", "train.py", "--tp", "{tp}", "--pp", "{pp}", "--dp", "{dp}"],
    )  # fmt: skip
    job_id, _ = store.submit(spec, plans_of(info), info.model, marp.get_model(info.model).param_count())
    return job_id


def options_of(info: JobInfo) -> tuple[PlanOption, ...]:
    """What HAS should see of the job's plans once read back: the simulator's own options."""
    return tuple(FrenzyPolicy.option(p, info) for p in info.profile.plans)


# ---- checks ------------------------------------------------------------------------------


def check_queue(queue: list[QueuedJob], expected: dict[str, tuple]) -> None:
    """``expected``: job id -> the HAS plans its submission should give back."""
    got = {q.job_id: q for q in queue}
    if len(queue) != len(expected) or got.keys() != expected.keys():
        raise AssertionError(f"queue(): {len(queue)} jobs, expected {len(expected)} "
                             f"(missing {len(expected.keys() - got.keys())}, extra {len(got.keys() - expected.keys())})")
    for job_id, want in expected.items():
        have = got[job_id].plans
        if len(have) != len(want):
            raise AssertionError(f"queue(): {job_id} has {len(have)} plans, submitted {len(want)}")
        for h, w in zip(have, want, strict=True):
            same = (h.gpu_type, h.tp, h.pp, h.dp, h.bytes_per_gpu) == (w.gpu_type, w.tp, w.pp, w.dp, w.bytes_per_gpu)
            if not same or h.runtime_s is None or abs(h.runtime_s - w.runtime_s) > 1e-9 * max(1.0, w.runtime_s):
                raise AssertionError(f"queue(): {job_id} plan {h} differs from the submitted {w}")


def owners_of(view: ClusterView) -> dict[tuple[str, int], tuple[str | None, float | None]]:
    return {(g.node, g.index): (g.owner, g.free_at) for n in view.nodes for g in n.gpus}


def check_view(view: ClusterView, owner: dict[tuple[str, int], str], ends: dict[str, float], total: int) -> None:
    """The view says exactly who holds which GPU, and until when."""
    seen = owners_of(view)
    if len(seen) != total:
        raise AssertionError(f"cluster(): {len(seen)} GPUs, expected {total}")
    free = total - len(owner)
    if view.free_count() != free:
        raise AssertionError(f"cluster(): {view.free_count()} free GPUs, expected {free}")
    for gpu, (have, free_at) in seen.items():
        want = owner.get(gpu)
        if have != want:
            raise AssertionError(f"cluster(): {gpu} owned by {have}, expected {want}")
        if want is not None and free_at != ends[want]:
            raise AssertionError(f"cluster(): {gpu} free_at {free_at}, expected {ends[want]} (est_end of {want})")


# ---- churn -------------------------------------------------------------------------------


class Churn:
    """Small changes between two ticks, as a live cluster makes them, and what they should read back as."""

    def __init__(self, client: redis.Redis, keys: Keys, store: StateStore, sim: Simulator,
                 ends: dict[str, float], queued: dict[str, tuple], seed: int) -> None:
        self.r, self.k, self.store, self.sim = client, keys, store, sim
        self.ends = dict(ends)
        self.owner = {gpu: job for gpu, job in sim.owner.items()}
        self.gpus: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for gpu, job in self.owner.items():
            self.gpus[job].append(gpu)
        self.all_gpus = sorted((g.node, g.index) for n in sim.cluster_view().nodes for g in n.gpus)
        self.queued = dict(queued)  # job id -> plans HAS should see
        self.queued_order = list(queued)
        self.sources = list(sim.queue)  # simulator jobs that new submissions copy
        self.rng = random.Random(seed)
        self.fence = int(client.get(keys.seq()) or 0) + 10_000
        self.n = 0

    def step(self) -> None:
        self.n += 1
        pipe = self.r.pipeline(transaction=True)
        # One running job ends: its GPUs go back (owner cleared; fence kept, as transition_job does).
        done = self.rng.choice(sorted(self.gpus))
        released = self.gpus.pop(done)
        for node, idx in released:
            pipe.hset(self.k.gpu(node, idx), "owner", "")
            pipe.hincrby(self.k.node(node), "rev", 1)  # as the releasing scripts do
            del self.owner[(node, idx)]
        pipe.hset(self.k.job(done), mapping={"state": JobState.SUCCEEDED.value, "updated_at": repr(time.time())})
        del self.ends[done]
        done_nodes = {n for n, _ in released}
        # A free GPU on another node gets an owner: a new one-GPU job, with its estimated end.
        free = [g for g in self.all_gpus if g not in self.owner and g[0] not in done_nodes]
        gpu = self.rng.choice(free)
        job = f"churn-{self.n}"
        self.fence += 1
        end = time.time() + self.rng.uniform(600, 7200)
        pipe.hset(self.k.job(job), mapping={"id": job, "name": job, "state": JobState.RUNNING.value,
                                             "fence": self.fence, "attempt": 1, "est_end": repr(end),
                                             "placement": json.dumps([[gpu[0], [gpu[1]]]])})
        pipe.hset(self.k.gpu(*gpu), mapping={"owner": job, "fence": self.fence})
        pipe.hincrby(self.k.node(gpu[0]), "rev", 1)  # as place_jobs.lua does
        self.owner[gpu], self.gpus[job], self.ends[job] = job, [gpu], end
        # Another running job's estimated end moves (what completion-aware plan choice reads).
        moved = self.rng.choice(sorted(self.gpus))
        self.ends[moved] += self.rng.uniform(-300, 300)
        pipe.hset(self.k.job(moved), "est_end", repr(self.ends[moved]))
        # One queued job leaves the queue (cancelled while pending).
        gone = self.queued_order.pop(self.rng.randrange(len(self.queued_order)))
        del self.queued[gone]
        pipe.hset(self.k.job(gone), mapping={"state": JobState.CANCELLED.value, "updated_at": repr(time.time())})
        pipe.zrem(self.k.queue(), gone)
        pipe.execute()
        # And one is submitted.
        src = self.rng.choice(self.sources)
        new = submit(self.store, self.sim, src)
        self.queued[new] = options_of(self.sim.info[src])
        self.queued_order.append(new)


# ---- timing ------------------------------------------------------------------------------


def tick(store: StateStore, policy: QueuePolicy) -> tuple[dict[str, float], list[QueuedJob], ClusterView, int]:
    """One tick without side effects: queue, cluster, schedule. -> (ms per phase, queue, view, placed)"""
    t0 = time.perf_counter()
    queue = store.queue().jobs
    t1 = time.perf_counter()
    view = store.cluster().view
    t2 = time.perf_counter()
    result = schedule(view, queue, time.time(), policy)
    t3 = time.perf_counter()
    ms = {"queue": (t1 - t0) * 1e3, "cluster": (t2 - t1) * 1e3, "schedule": (t3 - t2) * 1e3, "tick": (t3 - t0) * 1e3}
    return ms, queue, view, len(result.placements)


def run_size(client: redis.Redis, gpus: int, reps: int, seed: int) -> tuple[list[dict], dict]:
    keys = Keys("bench")
    client.flushdb()
    t0 = time.perf_counter()
    sim, sim_now = build_state(gpus, seed)
    t_sim = time.perf_counter() - t0
    print(f"  {sim.total_gpus} GPUs: simulator state in {t_sim:.1f} s", file=sys.stderr)
    view0 = sim.cluster_view()
    t0 = time.perf_counter()
    register_nodes(client, keys, view0)
    wall = time.time()
    ends = write_running(client, keys, sim, sim_now, wall)
    t_nodes = time.perf_counter() - t0
    store = StateStore(client, keys)
    t0 = time.perf_counter()
    expected = {submit(store, sim, job_id): options_of(sim.info[job_id]) for job_id in sim.queue}
    t_submit = time.perf_counter() - t0
    print(f"  registered {len(view0.nodes)} nodes, {len(sim.running)} running jobs in {t_nodes:.1f} s; "
          f"submitted {len(expected)} jobs in {t_submit:.1f} s", file=sys.stderr)

    policy = QueuePolicy.frenzy(explain=False)
    churn = Churn(client, keys, store, sim, ends, expected, seed)
    cold, queue, view, placed0 = tick(store, policy)  # nothing cached yet
    check_queue(queue, churn.queued)
    check_view(view, churn.owner, churn.ends, sim.total_gpus)
    busy = len(churn.owner)
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    placed = []
    for i in range(reps):
        churn.step()
        ms, queue, view, n = tick(store, policy)
        check_queue(queue, churn.queued)
        check_view(view, churn.owner, churn.ends, sim.total_gpus)
        for p in PHASES:
            times[p].append(ms[p])
        placed.append(n)
        print(f"  rep {i + 1}/{reps}: tick {ms['tick']:.0f} ms", file=sys.stderr)
    # The periodic full read (every ``StateStore.full_read_s``): every GPU read again.
    store.full_read_s, every = 0.0, store.full_read_s
    full_ms = []
    for _ in range(reps):
        t0 = time.perf_counter()
        view = store.cluster().view
        full_ms.append((time.perf_counter() - t0) * 1000.0)
        check_view(view, churn.owner, churn.ends, sim.total_gpus)
    store.full_read_s = every

    state = {
        "gpus": sim.total_gpus, "nodes": len(view.nodes), "busy_gpus": busy,
        "busy_gpus_last": len(churn.owner), "free_gpus_last": view.free_count(),
        "running_jobs": len(sim.running), "queued_jobs": len(queue),
        "plans_per_job": statistics.fmean(len(q.plans) for q in queue),
        "placed_cold": placed0, "placed_median": statistics.median(placed),
        "placed_min": min(placed), "placed_max": max(placed),
    }  # fmt: skip
    rows = [{"gpus": sim.total_gpus, "phase": p, "reps": reps, "ms_median": statistics.median(times[p]),
             "ms_min": min(times[p]), "ms_max": max(times[p]), "cold_ms": cold[p], **state}
            for p in PHASES]  # fmt: skip
    rows.append({"gpus": sim.total_gpus, "phase": "cluster_full_read", "reps": reps,
                 "ms_median": statistics.median(full_ms), "ms_min": min(full_ms), "ms_max": max(full_ms),
                 "cold_ms": None, "every_s": every, **state})  # fmt: skip
    setup = {"sim_state_s": t_sim, "register_and_running_s": t_nodes, "submit_s": t_submit,
             "cluster_spec": cluster_of(gpus)}  # fmt: skip
    return rows, setup


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000", help="cluster sizes in GPUs, comma-separated")
    ap.add_argument("--reps", type=int, default=11, help="timed ticks per size")
    ap.add_argument("--big-reps", type=int, default=None,
                    help="timed ticks for sizes of 5,000 GPUs and more (default: --reps)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    notes = []
    rows: list[dict] = []
    setup: dict[str, dict] = {}
    cpu_start = cpu_ref_us()
    server = start_redis()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        version = client.info("server")["redis_version"]
        for gpus in sizes:
            reps = args.big_reps if args.big_reps is not None and gpus >= 5000 else args.reps
            if reps != args.reps:
                notes.append(f"{gpus} GPUs: {reps} timed ticks instead of {args.reps} (--big-reps)")
            print(f"{gpus} GPUs ...", file=sys.stderr)
            size_rows, setup[str(gpus)] = run_size(client, gpus, reps, args.seed)
            rows += size_rows
        client.close()
    finally:
        server.stop()

    out = {"bench": "scheduler_tick", "python": platform.python_version(), "machine": platform.machine(),
           "redis": version, "cpu_ref_us": cpu_start, "cpu_ref_us_end": cpu_ref_us(), "notes": notes,
           "rows": rows, "setup": setup}  # fmt: skip
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
