"""Frenzy's Redis state at 10,000 nodes and 100,000 queued jobs: memory per item and the scheduler's reads.

One command, JSON last on stdout (progress on stderr):

    .venv/bin/python bench/scale_state.py                         # the sizes docs/scaling.md quotes
    .venv/bin/python bench/scale_state.py --nodes 1000 --queued 10000 --reps 3   # a quick run

Everything runs against a private ``redis-server`` (``frenzy.devstack.redis_server.start_redis``:
loopback, free port, stopped at the end, also on error) and writes through Frenzy's own code:

**Memory** (``INFO memory`` ``used_memory`` before and after, divided by the count; and Redis'
``MEMORY USAGE key SAMPLES 0`` of the keys themselves, for the breakdown):

* a node: registered with the agent's ``register_node`` script and arguments
  (``bench/scheduler_tick.register_nodes``: node hash, 8 GPU hashes with all 13 fields, the
  ``alive`` lease) plus its signing key (``node_keys.create``, as an operator makes it);
* a queued job: ``StateStore.submit`` of a job from ``has.sim.traces.synthetic`` with MARP's ranked
  plans as the predictor sends them (``bench/scheduler_tick.submit``: job hash with spec and
  ~40 plans, history, ``jobs`` and ``queue`` entries);
* a launch-stream entry and a finished job: a real ``SchedulerLoop.tick()`` places those jobs on
  the registered nodes (``place_jobs.lua``: signed launches XADDed to ``launch:{node}``); each
  placed job's agents' RUNNING and EXITED events (signed with the node's key, a 20-line output
  tail, as the agent sends them) go to the events stream and ``SchedulerLoop.drain_events``
  finishes the jobs; then the job hashes, histories and streams are measured;
* an event: the events stream's growth per XADD.

**Reads at scale** (ms, ``time.perf_counter``):

* ``cluster()``: for each ``--nodes`` size, nodes of 8 GPUs registered as above, 60 % of the nodes
  held by a running job (owner and fence on its GPUs, a job hash with ``est_end``); cold (a new
  ``StateStore``, as after a scheduler restart), incremental (after one job ends and another
  starts, each GPU write bumping the node's ``rev`` as the scripts do: ``tests/support/state.set_gpu``)
  and the periodic full read; the view is checked against what was written;
* ``queue()``: for each ``--queued`` size, the submitted jobs cloned (``DUMP``/``RESTORE`` of real
  job hashes, new ids, history, ``jobs`` and ``queue`` entries, as ``submit_job.lua`` writes them:
  100,000 real submissions would take ~5 minutes here, 3.2 ms each) up to that length; the first read (cold)
  and incremental reads (one job cancelled and one submitted between two reads), checked;
* ``has.schedule`` (``QueuePolicy.frenzy(explain=False)``) of each queue on each cluster view;
* SubmitJob's per-user queued count (``SchedulerServicer._queued_jobs``: one HGET per queued job).

For the incremental reads and the count, ``*_redis_ms_median`` is the time Redis itself spent
on them (``INFO commandstats`` after ``CONFIG RESETSTAT``): its one core's share of a tick.

Per-item costs are then multiplied out to 10,000 nodes and 100,000 queued jobs (``extrapolated``:
labelled as such). ``cpu_ref_us``: median µs of ``sum(range(1000))`` before and after, to compare
machines.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.scheduler_tick and tests.support, reused as they are

from bench.scheduler_tick import cpu_ref_us, register_nodes, submit  # noqa: E402
from frenzy.devstack.redis_server import start_redis  # noqa: E402
from frenzy.scheduler.loop import SchedulerLoop  # noqa: E402
from frenzy.scheduler.service import SchedulerServicer  # noqa: E402
from frenzy.state import node_keys  # noqa: E402
from frenzy.state.job_states import JobState  # noqa: E402
from frenzy.state.keys import Keys  # noqa: E402
from frenzy.state.messages import AgentEvent, EventKind  # noqa: E402
from frenzy.state.store import StateStore, history_entry  # noqa: E402
from has import ClusterView, GpuSlot, NodeView, QueuePolicy, schedule  # noqa: E402
from has.sim.scale import build_state  # noqa: E402
from tests.support.state import send_event, set_gpu  # noqa: E402

GiB = 1024**3
GPUS_PER_NODE = 8
# GPU types by node, in cluster_of()'s proportions of the 8-GPU types (has/sim/scale.py) and L4s.
MIX = (("H100-80GB", 80 * GiB, 25), ("A100-80GB", 80 * GiB, 35), ("A100-40GB", 40 * GiB, 20), ("L4", 24 * GiB, 20))
BUSY_SHARE = 0.6  # nodes held by a running job, as in has.sim.scale.build_state
TARGET_NODES, TARGET_GPUS, TARGET_QUEUED = 10_000, 80_000, 100_000
CLONE_BATCH = 500
TAIL = [f"step {i}: loss 2.{i:03d} lr 3.0e-4 tokens/s 41234.5 mem 61.2 GiB" for i in range(20)]  # an exit's tail


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def usage(r: redis.Redis, keys: list[str]) -> int:
    """Sum of ``MEMORY USAGE key SAMPLES 0`` (every element counted, not a sample)."""
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.memory_usage(k, samples=0)
    return sum(int(v or 0) for v in pipe.execute())


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def redis_busy_us(r: redis.Redis) -> int:
    """Microseconds Redis has spent running commands since its stats were last reset (``INFO commandstats``)."""
    return sum(int(v["usec"]) for v in r.info("commandstats").values())


def stats(ms: list[float]) -> dict:
    return {"ms_median": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms), "reps": len(ms)}


def timed(fn, *args):  # noqa: ANN001, ANN202
    t0 = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t0) * 1e3, out


def nodes_view(count: int, prefix: str, busy: dict[str, str] | None = None) -> ClusterView:
    """``count`` nodes of 8 GPUs in MIX's proportions (by node index), owners from ``busy`` (node -> job)."""
    busy = busy or {}
    wheel = [(t, m) for t, m, share in MIX for _ in range(share)]
    nodes = []
    for i in range(count):
        name = f"{prefix}-{i:05d}"
        gpu_type, mem = wheel[i % len(wheel)]
        owner = busy.get(name)
        nodes.append(NodeView(name, tuple(GpuSlot(name, g, gpu_type, mem, mem if owner is None else mem // 4, owner)
                                          for g in range(GPUS_PER_NODE))))
    return ClusterView(nodes)


# ---- memory per item -----------------------------------------------------------------------


def measure_memory(r: redis.Redis, raw: redis.Redis, nodes: int, jobs: int, seed: int) -> tuple[dict, list[bytes]]:
    """``raw``: a client of the same server handing back bytes (``DUMP`` payloads are not text).
    -> (the memory rows, ``DUMP`` of each submitted job's hash as it was queued)"""
    k = Keys("mem")
    out: dict = {}
    # Nodes: the agent's registration and the operator's signing key.
    view = nodes_view(nodes, "node")
    m0 = used(r)
    t0 = time.perf_counter()
    register_nodes(r, k, view)
    for n in view.nodes:
        node_keys.create(r, k, n.name)
    m1 = used(r)
    names = [n.name for n in view.nodes]
    sample = names[:50]
    out["node"] = {
        "count": nodes, "gpus_per_node": GPUS_PER_NODE, "bytes_per_node": (m1 - m0) / nodes,
        "write_s": time.perf_counter() - t0,
        "usage_per_node": {  # MEMORY USAGE of one node's keys, mean over 50
            "node_hash": usage(r, [k.node(n) for n in sample]) / len(sample),
            "gpu_hashes": usage(r, [k.gpu(n, g) for n in sample for g in range(GPUS_PER_NODE)]) / len(sample),
            "alive_key": usage(r, [k.node_alive(n) for n in sample]) / len(sample),
            "signing_key": usage(r, [k.node_key(n) for n in sample]) / len(sample),
        },
    }
    log(f"memory: {nodes} nodes, {out['node']['bytes_per_node']:.0f} B each")

    # Queued jobs: StateStore.submit with MARP's plans.
    sim, _ = build_state(64, seed, queued=jobs)
    store = StateStore(r, k)
    m0 = used(r)
    t0 = time.perf_counter()
    ids = [submit(store, sim, j) for j in list(sim.queue)]
    submit_s = time.perf_counter() - t0
    m1 = used(r)
    plans = [len(json.loads(r.hget(k.job(i), "plans") or "[]")) for i in ids[:200]]
    out["queued_job"] = {
        "count": jobs, "bytes_per_job": (m1 - m0) / jobs, "plans_per_job_mean": statistics.fmean(plans),
        "plans_json_bytes_mean": statistics.fmean(len(r.hget(k.job(i), "plans") or "") for i in ids[:200]),
        "spec_json_bytes_mean": statistics.fmean(len(r.hget(k.job(i), "spec") or "") for i in ids[:200]),
        "submit_ms_per_job": submit_s * 1e3 / jobs,
        "usage_per_job": {"job_hash": usage(r, [k.job(i) for i in ids[:200]]) / 200,
                          "history": usage(r, [k.job_history(i) for i in ids[:200]]) / 200},
    }
    log(f"memory: {jobs} queued jobs, {out['queued_job']['bytes_per_job']:.0f} B each")
    # The queue section clones these jobs as submitted (before they are placed below).
    templates = [raw.dump(k.job(i)) for i in ids]

    # Placement: a real tick places what fits; the launch streams hold the signed launches.
    loop = SchedulerLoop(r, k)
    loop.explain_every_s = float("inf")  # pending reasons are not what is measured here
    m0 = used(r)
    placed: list[str] = []
    for _ in range(5):
        report = loop.tick()
        placed += report.placed
        if not report.placed:
            break
    m1 = used(r)
    streams = [k.launch_stream(n) for n in names if r.exists(k.launch_stream(n))]
    entries = sum(r.xlen(s) for s in streams)
    # Marginal cost of one more launch entry: a real entry XADDed again to one stream, as place_jobs.lua does.
    probe = k.launch_stream("probe")
    data = r.xrange(streams[0], count=1)[0][1]
    m2 = used(r)
    pipe = r.pipeline(transaction=False)
    for _ in range(2000):
        pipe.xadd(probe, data, maxlen=10_000, approximate=True)
    pipe.execute()
    m3 = used(r)
    r.delete(probe)
    out["launch_entry"] = {
        "placed_jobs": len(placed), "entries": entries, "streams": len(streams),
        "entry_data_bytes": len(data["data"]), "bytes_per_entry_marginal": (m3 - m2) / 2000,
        "usage_per_entry_incl_stream_overhead": usage(r, streams) / max(1, entries),
        "placement_bytes_per_job": (m1 - m0) / max(1, len(placed)),
        "stream_maxlen_per_node": 10_000,
    }
    log(f"memory: {len(placed)} jobs placed, {entries} launch entries, "
        f"{out['launch_entry']['bytes_per_entry_marginal']:.0f} B each")

    # Events: each placed job's agents report RUNNING then EXITED 0; the loop finishes the jobs.
    jobs_now = store.get_many(placed)
    m0 = used(r)
    sent = 0
    for job in jobs_now.values():
        assert job is not None
        for node, _ in job.placement:
            send_event(r, k, AgentEvent(kind=EventKind.RUNNING, job_id=job.id, attempt=job.attempt, node=node,
                                        fence=job.fence, pid=4242, log_path=f"/var/log/frenzy/{job.id}/{node}.log"))
            sent += 1
    for job in jobs_now.values():
        assert job is not None
        for node, _ in job.placement:
            send_event(r, k, AgentEvent(kind=EventKind.EXITED, job_id=job.id, attempt=job.attempt, node=node,
                                        fence=job.fence, exit_code=0, tail=TAIL, peak_bytes_per_gpu=40 * GiB))
            sent += 1
    m1 = used(r)
    handled = 0
    for _ in range(10_000):
        n = loop.drain_events(block_ms=1, count=500)
        handled += n
        if n == 0 and handled >= sent:
            break
    finished = store.get_many(placed)
    states = {j.state for j in finished.values() if j is not None}
    if states != {JobState.SUCCEEDED}:
        raise AssertionError(f"finished jobs: states {states}, expected all SUCCEEDED")
    fin = placed[:200]
    out["event"] = {"count": sent, "bytes_per_event": (m1 - m0) / sent,
                    "usage_per_event": usage(r, [k.events_stream()]) / sent,
                    "stream_capped": False}  # agents XADD without MAXLEN (services/agent/daemon.py _emit)
    out["finished_job"] = {
        "count": len(placed),
        "usage_per_job": {"job_hash": usage(r, [k.job(i) for i in fin]) / len(fin),
                          "history": usage(r, [k.job_history(i) for i in fin]) / len(fin)},
        "history_entries_mean": statistics.fmean(r.llen(k.job_history(i)) for i in fin),
        "fields_mean": statistics.fmean(r.hlen(k.job(i)) for i in fin),
    }
    # used_memory per byte of MEMORY USAGE, from the queued jobs (both measured): scales the finished
    # jobs' MEMORY USAGE to used_memory (allocator slack, the zset entries).
    q = out["queued_job"]
    ratio = q["bytes_per_job"] / (q["usage_per_job"]["job_hash"] + q["usage_per_job"]["history"])
    f = out["finished_job"]
    f["used_memory_ratio_from_queued"] = ratio
    f["bytes_per_job_est"] = ratio * (f["usage_per_job"]["job_hash"] + f["usage_per_job"]["history"])
    log(f"memory: {sent} events, {out['event']['bytes_per_event']:.0f} B each; finished job "
        f"~{f['bytes_per_job_est']:.0f} B")
    return out, templates


# ---- cluster reads ---------------------------------------------------------------------------


def write_running(r: redis.Redis, k: Keys, busy: dict[str, str], now: float) -> None:
    """Each busy node's 8 GPUs held by one running job (owner and fence, node ``rev`` bumped, as a
    reservation leaves them) and that job's hash with what ``cluster()`` reads of an owner."""
    items = list(busy.items())
    for start in range(0, len(items), 256):
        pipe = r.pipeline(transaction=False)
        for fence, (node, job) in enumerate(items[start:start + 256], start=start + 1):
            for g in range(GPUS_PER_NODE):
                pipe.hset(k.gpu(node, g), mapping={"owner": job, "fence": fence})
            pipe.hincrby(k.node(node), "rev", 1)
            pipe.hset(k.job(job), mapping={
                "id": job, "state": JobState.RUNNING.value, "attempt": 1, "fence": fence, "submitted_at": repr(now - 600),
                "reserved_at": repr(now - 300), "est_end": repr(now + 3600 + fence),
                "placement": json.dumps([[node, list(range(GPUS_PER_NODE))]])})  # fmt: skip
            pipe.zadd(k.jobs(), {job: now - 600})
        pipe.execute()


def measure_cluster(r: redis.Redis, nodes: int, reps: int, seed: int) -> tuple[dict, ClusterView]:
    k = Keys(f"c{nodes}")
    rng = random.Random(seed)
    names = [f"n{nodes}-{i:05d}" for i in range(nodes)]
    busy = {n: f"run-{n}" for n in rng.sample(names, int(BUSY_SHARE * nodes))}
    view0 = nodes_view(nodes, f"n{nodes}", busy)
    t0 = time.perf_counter()
    m0 = used(r)
    register_nodes(r, k, view0)
    now = time.time()
    write_running(r, k, busy, now)
    setup_s = time.perf_counter() - t0
    log(f"cluster {nodes} nodes: written in {setup_s:.1f} s")
    store = StateStore(r, k)
    cold, view = timed(store.cluster)
    total = nodes * GPUS_PER_NODE

    def check(v: ClusterView) -> None:
        free = total - GPUS_PER_NODE * len(busy)
        if v.free_count() != free or len(v.nodes) != nodes:
            raise AssertionError(f"cluster(): {len(v.nodes)} nodes, {v.free_count()} free; expected {nodes}, {free}")
        for n in v.nodes:
            want = busy.get(n.name)
            if any(g.owner != want for g in n.gpus):
                raise AssertionError(f"cluster(): node {n.name} owners {[g.owner for g in n.gpus]}, expected {want}")

    check(view)
    incr, busy_us = [], []
    for i in range(reps):
        # One job ends (its GPUs freed), one starts on a free node: each GPU write bumps rev.
        done = rng.choice(sorted(busy))
        for g in range(GPUS_PER_NODE):
            set_gpu(r, k, done, g, owner="")
        del busy[done]
        start = rng.choice([n for n in names if n not in busy and n != done])
        job = f"churn-{nodes}-{i}"
        r.hset(k.job(job), mapping={"id": job, "state": JobState.RUNNING.value, "submitted_at": repr(now),
                                    "reserved_at": repr(now), "est_end": repr(now + 7200)})
        for g in range(GPUS_PER_NODE):
            set_gpu(r, k, start, g, owner=job, fence=10_000_000 + i)
        busy[start] = job
        r.config_resetstat()
        ms, view = timed(store.cluster)
        busy_us.append(redis_busy_us(r))
        check(view)
        incr.append(ms)
    store.full_read_s, every = 0.0, store.full_read_s
    full = []
    for _ in range(reps):
        ms, view = timed(store.cluster)
        check(view)
        full.append(ms)
    store.full_read_s = every
    row = {"nodes": nodes, "gpus": total, "busy_nodes": len(busy), "setup_s": setup_s,
           "redis_bytes": used(r) - m0, "cold_ms": cold, "incremental": stats(incr),
           "incremental_redis_ms_median": statistics.median(busy_us) / 1e3,
           "full_read": {**stats(full), "every_s": every}}  # fmt: skip
    log(f"cluster {nodes} nodes: cold {cold:.0f} ms, incremental {statistics.median(incr):.1f} ms, "
        f"full {statistics.median(full):.0f} ms")
    return row, view


# ---- queue reads ---------------------------------------------------------------------------


class Cloner:
    """Grows the queue with copies of real submitted jobs: each a RESTORE of a template's job hash
    with its own id, sequence and times, its history entry, ``jobs`` and ``queue`` entries."""

    def __init__(self, raw: redis.Redis, k: Keys, blobs: list[bytes]) -> None:
        self.r, self.k = raw, k
        self.blobs = blobs
        self.ids: list[str] = []

    def add(self, count: int) -> list[str]:
        new = []
        top = int(self.r.incrby(self.k.seq(), count))
        seqs = iter(range(top - count + 1, top + 1))
        for start in range(0, count, CLONE_BATCH):
            pipe = self.r.pipeline(transaction=False)
            now = time.time()
            for n in range(start, min(count, start + CLONE_BATCH)):
                job_id, seq = f"job-{uuid.uuid4().hex[:12]}", next(seqs)
                k = self.k.job(job_id)
                pipe.restore(k, 0, self.blobs[n % len(self.blobs)])
                pipe.hset(k, mapping={"id": job_id, "seq": seq, "submitted_at": repr(now), "updated_at": repr(now)})
                pipe.rpush(self.k.job_history(job_id), history_entry(JobState.PENDING, "submitted", now))
                pipe.zadd(self.k.jobs(), {job_id: now})
                pipe.zadd(self.k.queue(), {job_id: seq})
                new.append(job_id)
            pipe.execute()
        self.ids += new
        return new

    def cancel(self, job_id: str) -> None:
        """Out of the queue as a cancel of a PENDING job leaves it (state CANCELLED, not queued)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.zrem(self.k.queue(), job_id)
        pipe.hset(self.k.job(job_id), "state", JobState.CANCELLED.value)
        pipe.execute()
        self.ids.remove(job_id)


def measure_queue(r: redis.Redis, raw: redis.Redis, sizes: list[int], templates: list[bytes], views: dict[int, ClusterView],
                  reps: int, seed: int) -> list[dict]:
    k = Keys("mem")
    rng = random.Random(seed)
    cloner = Cloner(raw, k, templates)
    # The templates were placed and finished (or still wait): the queue starts empty, clones only.
    r.delete(k.queue())
    rows = []
    for size in sizes:
        grow = size - len(cloner.ids)
        per_job = rows[-1]["redis_bytes_per_job"] if rows else 40_000
        per_py = rows[-1]["python_rss_per_job_first_read"] if rows else 150_000
        need = grow * (per_job + per_py)
        if need > 0.7 * mem_available():
            rows.append({"queued": size, "skipped": f"would need ~{need / GiB:.1f} GiB, "
                                                    f"{mem_available() / GiB:.1f} GiB available"})
            log(f"queue {size}: skipped, {rows[-1]['skipped']}")
            continue
        m0 = used(r)
        t0 = time.perf_counter()
        cloner.add(grow)
        fill_s = time.perf_counter() - t0
        redis_total = used(r)
        log(f"queue {size}: filled in {fill_s:.1f} s, Redis {redis_total / GiB:.2f} GiB")
        gc.collect()
        rss0 = rss_bytes()
        store = StateStore(r, k)
        cold, queue = timed(store.queue)
        rss1 = rss_bytes()
        if len(queue) != size:
            raise AssertionError(f"queue(): {len(queue)} jobs, expected {size}")
        incr, busy_us = [], []
        for _ in range(reps):
            gone = rng.choice(cloner.ids)
            cloner.cancel(gone)
            (came,) = cloner.add(1)
            r.config_resetstat()
            ms, queue = timed(store.queue)
            busy_us.append(redis_busy_us(r))
            ids = {q.job_id for q in queue}
            if len(queue) != size or gone in ids or came not in ids:
                raise AssertionError(f"queue(): {len(queue)} jobs after a cancel and a submit, expected {size} "
                                     f"without {gone} and with {came}")
            incr.append(ms)
        counted, counted_us = [], []
        # The O(queue) read: the whole of _queued_jobs at the commit that filed issue 15, and since
        # then the path of a standby or of a loop that has not read the queue yet (as this
        # servicer's own loop has not); no predictor is called.
        servicer = SchedulerServicer(r, k, predictor=None)  # type: ignore[arg-type]
        for _ in range(reps):
            r.config_resetstat()
            ms, n = timed(servicer._queued_jobs, "")
            counted_us.append(redis_busy_us(r))
            if n != size:
                raise AssertionError(f"_queued_jobs: {n}, expected {size}")
            counted.append(ms)
        sched = {}
        for nodes, view in views.items():
            times, placed = [], 0
            for _ in range(1 if size > 20_000 else reps):
                ms, result = timed(schedule, view, queue, time.time(), QueuePolicy.frenzy(explain=False))
                times.append(ms)
                placed = len(result.placements)
            sched[str(nodes)] = {**stats(times), "placed": placed}
            log(f"queue {size}: schedule on {nodes} nodes {statistics.median(times):.0f} ms, {placed} placed")
        row = {"queued": size, "fill_s": fill_s, "redis_used_bytes": redis_total,
               "redis_bytes_per_job": (redis_total - m0) / max(1, grow),
               "cold_ms": cold, "python_rss_growth_first_read": rss1 - rss0,
               "python_rss_per_job_first_read": (rss1 - rss0) / size,
               "incremental": stats(incr), "incremental_redis_ms_median": statistics.median(busy_us) / 1e3,
               "submit_queued_count": stats(counted), "submit_queued_count_redis_ms_median":
                   statistics.median(counted_us) / 1e3, "schedule": sched}  # fmt: skip
        log(f"queue {size}: cold {cold:.0f} ms, incremental {statistics.median(incr):.0f} ms, "
            f"_queued_jobs {statistics.median(counted):.0f} ms, Python +{(rss1 - rss0) / GiB:.2f} GiB")
        rows.append(row)
        del store, queue
        gc.collect()
    return rows


def extrapolate(mem: dict) -> dict:
    """Measured per-item costs multiplied out to the target sizes (an extrapolation, not a measurement)."""
    node = mem["node"]["bytes_per_node"]
    job = mem["queued_job"]["bytes_per_job"]
    fin = mem["finished_job"]["bytes_per_job_est"]
    entry = mem["launch_entry"]["bytes_per_entry_marginal"]
    event = mem["event"]["bytes_per_event"]
    return {
        "note": "extrapolated: measured per-item bytes x count",
        "nodes_10k_bytes": node * TARGET_NODES,
        "queued_100k_bytes": job * TARGET_QUEUED,
        "finished_per_1m_jobs_bytes": fin * 1_000_000,
        "launch_streams_at_cap_bytes": entry * 10_000 * TARGET_NODES,  # MAXLEN ~10,000 per node stream
        "launch_streams_100_per_node_bytes": entry * 100 * TARGET_NODES,
        "events_per_1m_bytes": event * 1_000_000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1000,10000", help="cluster sizes in nodes of 8 GPUs, comma-separated")
    ap.add_argument("--queued", default="10000,100000", help="queue lengths, comma-separated, ascending")
    ap.add_argument("--mem-nodes", type=int, default=1000, help="nodes written to measure a node's memory")
    ap.add_argument("--mem-jobs", type=int, default=1000, help="jobs submitted to measure a job's memory")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    node_sizes = [int(s) for s in args.nodes.split(",") if s]
    queue_sizes = sorted(int(s) for s in args.queued.split(",") if s)
    if any(n < 10 for n in node_sizes) or any(q < 1 for q in queue_sizes) or args.mem_nodes < 10 or args.mem_jobs < 10:
        ap.error("--nodes, --mem-nodes and --mem-jobs need at least 10; --queued at least 1")

    cpu_start = cpu_ref_us()
    server = start_redis()
    try:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        raw = redis.Redis.from_url(server.url)  # bytes: DUMP / RESTORE payloads
        version = r.info("server")["redis_version"]
        mem, templates = measure_memory(r, raw, args.mem_nodes, args.mem_jobs, args.seed)
        clusters, views = [], {}
        for nodes in node_sizes:
            row, views[nodes] = measure_cluster(r, nodes, args.reps, args.seed)
            clusters.append(row)
        queues = measure_queue(r, raw, queue_sizes, templates, views, args.reps, args.seed)
        r.close()
        raw.close()
    finally:
        server.stop()
    out = {"bench": "scale_state", "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "redis": version, "cpu_ref_us": cpu_start, "cpu_ref_us_end": cpu_ref_us(),
           "python_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "memory": mem, "extrapolated": extrapolate(mem),
           "cluster": clusters, "queue": queues}  # fmt: skip
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
