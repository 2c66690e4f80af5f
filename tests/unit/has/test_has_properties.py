"""Property-based invariants (hypothesis) of every policy over random clusters and jobs,
and the proof that the live scheduler runs the simulator's frenzy code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzy.state.cluster_read import ClusterSnapshot, LiveJob
from frenzy.state.queue_read import QueueSnapshot
from has import ClusterView, GpuSlot, NodeView, PlanOption, QueuedJob, QueuePolicy, RunningJob, schedule
from has.cluster_spec import parse_cluster
from has.sim.baselines import FrenzyPolicy, make_policy
from has.sim.engine import Simulator, SimView, Start
from has.sim.traces import TraceJob

GiB = 1 << 30
TYPES = {"A100-80GB": 80 * GiB, "L4": 24 * GiB, "H100-80GB": 80 * GiB}


@st.composite
def clusters(draw: st.DrawFn) -> ClusterView:
    nodes = []
    for n in range(draw(st.integers(1, 6))):
        gpu_type = draw(st.sampled_from(sorted(TYPES)))
        size = draw(st.sampled_from([1, 2, 4, 8]))
        gpus = []
        for i in range(size):
            busy = draw(st.booleans())
            total = TYPES[gpu_type]
            gpus.append(GpuSlot(
                f"n{n}", i, gpu_type, total,
                draw(st.integers(0, total)) if busy else draw(st.sampled_from([total, total // 2])),
                "running" if busy else None, draw(st.integers(0, 9)) > 0,
                draw(st.none() | st.floats(0, 1e5)) if busy else None,
            ))  # fmt: skip
        nodes.append(NodeView(f"n{n}", tuple(gpus), alive=draw(st.booleans()) or n % 2 == 0))
    return ClusterView(nodes)


@st.composite
def queues(draw: st.DrawFn) -> list[QueuedJob]:
    jobs = []
    for k in range(draw(st.integers(0, 12))):
        plans = []
        for _ in range(draw(st.integers(0, 4))):
            tp = draw(st.sampled_from([1, 2, 4, 8]))
            plans.append(PlanOption(
                draw(st.sampled_from(sorted(TYPES))), tp, 1, draw(st.integers(1, 4)),
                draw(st.integers(1, 80)) * GiB, "",
                draw(st.none() | st.floats(1.0, 1e5)),
            ))  # fmt: skip
        jobs.append(QueuedJob(f"j{k}", k, draw(st.floats(0, 2e4)), tuple(plans)))
    return jobs


POLICIES = [
    QueuePolicy(),
    QueuePolicy(starvation_s=0.0),
    QueuePolicy.frenzy(),
    QueuePolicy.frenzy(starvation_s=0.0),
    QueuePolicy.frenzy(order="fifo"),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), queues(), st.sampled_from(POLICIES), st.floats(0, 3e4))
def test_schedule_invariants(
    cluster: ClusterView, queue: list[QueuedJob], policy: QueuePolicy, now: float
) -> None:
    """No GPU twice, TP groups within a node, memory never exceeded, only free healthy GPUs."""
    res = schedule(cluster, queue, now, policy)
    taken: set[tuple[str, int]] = set()
    held = set(res.reservation.gpus()) if res.reservation else set()
    for p in res.placements:
        for node_name, indices in p.nodes:
            assert len(indices) % p.plan.tp == 0  # whole TP groups on each node
            node = cluster.node(node_name)
            assert node.schedulable
            for i in indices:
                gpu = next(g for g in node.gpus if g.index == i)
                assert gpu.is_free and gpu.gpu_type == p.plan.gpu_type
                assert gpu.memory_free >= p.plan.bytes_per_gpu  # memory never exceeded
                assert (node_name, i) not in taken and (node_name, i) not in held
                taken.add((node_name, i))
    placed = {p.job_id for p in res.placements}
    assert placed.isdisjoint(res.pending) and placed | set(res.pending) == {j.job_id for j in queue}
    assert schedule(cluster, queue, now, policy) == res  # deterministic


SPEC = parse_cluster({"nodes": [
    {"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4},
    {"gpu": "A100-80GB", "count": 2, "gpus_per_node": 4},
    {"gpu": "L4", "count": 2, "gpus_per_node": 4},
]})  # fmt: skip
MODELS = ["qwen2.5-0.5b", "gpt2-355m", "llama-3.2-3b", "llama-2-7b", "llama-2-13b"]


@st.composite
def traces(draw: st.DrawFn) -> list[TraceJob]:
    out = []
    for k in range(draw(st.integers(1, 8))):
        model = draw(st.sampled_from(MODELS))
        seq = 1024 if model.startswith("gpt2") else 2048
        out.append(TraceJob(f"j{k}", draw(st.floats(0, 3600)), model, seq, 64,
                            64 * seq * draw(st.integers(1, 400)), draw(st.sampled_from([1, 2, 4, 8]))))  # fmt: skip
    return out


class _Audit:
    """Wraps a policy; checks each decision against the view it was given."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[attr-defined]
        self.round_s = inner.round_s  # type: ignore[attr-defined]

    def decide(self, view: SimView) -> Sequence[object]:
        actions = list(self.inner.decide(view))  # type: ignore[attr-defined]
        stopped = {a.job_id for a in actions if not isinstance(a, Start)}
        freed = {g for j in view.running if j.job_id in stopped for g in j.gpus}
        used: set[tuple[str, int]] = set()
        for a in actions:
            if isinstance(a, Start):
                for node_name, i in a.gpus:
                    gpu = next(g for g in view.cluster.node(node_name).gpus if g.index == i)
                    assert gpu.gpu_type == a.gpu_type
                    assert gpu.is_free or (node_name, i) in freed
                    assert (node_name, i) not in used
                    used.add((node_name, i))
                if a.plan_index is not None:  # a memory-aware start: the plan fits the GPU
                    job = next(j for j in view.queue if j.job_id == a.job_id)
                    plan = job.profile.plans[a.plan_index]
                    assert plan.memory.total <= view.cluster.node(a.gpus[0][0]).gpus[0].memory_total
                    per_node: dict[str, int] = {}
                    for node_name, _ in a.gpus:
                        per_node[node_name] = per_node.get(node_name, 0) + 1
                    assert all(c % plan.layout.tp == 0 for c in per_node.values())
        return actions


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), st.sampled_from(["frenzy", "frenzy-paper", "opportunistic", "sia", "gavel"]))
def test_every_policy_invariants_in_the_simulator(trace: list[TraceJob], name: str) -> None:
    sim = Simulator(SPEC, trace, _Audit(make_policy(name)))  # type: ignore[arg-type]
    res = sim.run()
    if name.startswith("frenzy"):
        assert res.oom_failures == 0
    assert not sim.owner
    for t, job_id, _, _ in sim.placements:
        assert t >= sim.trace[job_id].submit_s


class _FakeStore:
    """What ``SchedulerLoop.tick`` reads from its store, handed over as the simulator sees it."""

    def __init__(self, queue: list[QueuedJob], cluster: ClusterView, running: Sequence[RunningJob] = ()) -> None:
        self._queue, self._cluster, self._running = queue, cluster, list(running)
        self.reasons: dict[str, str] = {}

    def queue(self) -> QueueSnapshot:
        return QueueSnapshot(tuple(self._queue), None, 0.0)  # (the queue is open)

    def cluster(self) -> ClusterSnapshot:
        # every job resumable, as the simulator assumes (the real store reads JobSpec.resumable)
        return ClusterSnapshot(self._cluster, tuple(LiveJob(r, True) for r in self._running))

    def set_pending_reasons(self, reasons: dict[str, str]) -> None:
        self.reasons.update(reasons)  # (per job, as the store writes each job's field)


def _service(loop_class: type, store: _FakeStore, policy: QueuePolicy | None = None) -> Any:
    """A scheduler loop without Redis: only ``tick()``'s pure path is exercised."""
    service = loop_class.__new__(loop_class)
    service.store = store
    service.policy = policy or QueuePolicy.frenzy()
    service.explain_every_s, service._last_explained = 1.0, float("-inf")
    from frenzy.scheduler.metrics import SchedulerMetrics, Snapshots

    service.metrics, service.seen = SchedulerMetrics(), Snapshots()  # what tick() counts into
    return service


def test_live_scheduler_runs_the_same_policy_code() -> None:
    """Same cluster + queue: the scheduler service's tick reserves exactly the simulator's starts."""
    import frenzy.scheduler.loop as loop_mod
    import has
    from frenzy.scheduler.loop import SchedulerLoop

    assert loop_mod.schedule is has.schedule  # the service imports the very function

    trace = [TraceJob(f"j{k}", 0.0, m, 2048, 64, 64 * 2048 * (50 + 30 * k), 1)
             for k, m in enumerate(["llama-3.2-3b", "llama-2-7b", "qwen2.5-0.5b", "llama-2-13b", "llama-3.2-1b"])]  # fmt: skip
    policy = FrenzyPolicy("frenzy", QueuePolicy.frenzy())
    sim = Simulator(SPEC, trace, policy)
    sim._handle(0.0, 0, "j0", 0)  # arrivals, as the engine would process them
    for j in trace[1:]:
        sim._handle(0.0, 0, j.job_id, 0)
    view = SimView(sim, 0.0)
    starts = policy.decide(view)
    queue = [policy.queued_job(j) for j in view.queue]

    reserved: list[tuple[str, tuple[tuple[str, int], ...]]] = []

    class Loop(SchedulerLoop):
        def _place(self, placements: list[has.Placement]) -> list[tuple[has.Placement, bool, str]]:
            reserved.extend((p.job_id, tuple(p.gpus())) for p in placements)
            return [(p, True, "") for p in placements]

    service = _service(Loop, _FakeStore(queue, view.cluster))
    service.tick(now=0.0)
    assert reserved and reserved == [(s.job_id, s.gpus) for s in starts if isinstance(s, Start)]


def test_live_scheduler_preempts_as_the_simulator_does() -> None:
    """A long job started seconds before a much shorter one arrived: the simulator stops it and
    starts the short one; the service's tick, given the same cluster, queue and running job,
    stops the same job for the same one (and places the short one once the GPUs are back)."""
    import has
    from frenzy.scheduler.loop import SchedulerLoop

    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8, "name_prefix": "h100"}]})
    trace = [TraceJob("long", 0.0, "qwen2.5-32b", 2048, 64, 400_000_000, 8),
             TraceJob("short", 20.0, "qwen2.5-32b", 2048, 64, 2_000_000, 8)]  # fmt: skip
    policy = FrenzyPolicy("frenzy-completion", QueuePolicy.named("frenzy-completion"))
    sim = Simulator(spec, trace, policy, runtime_noise=0.0)
    sim._handle(0.0, 0, "long", 0)
    sim._decide(0.0)
    assert "long" in sim.running
    sim._handle(20.0, 0, "short", 0)
    view = SimView(sim, 20.0)
    actions = policy.decide(view)
    assert [type(a).__name__ for a in actions] == ["Stop", "Start"] and actions[0].job_id == "long"
    queue = [policy.queued_job(j) for j in view.queue]
    running = [RunningJob(j.job_id, j.started_at, j.submitted_at) for j in view.running]

    stopped: list[tuple[str, str]] = []
    reserved: list[str] = []

    class Loop(SchedulerLoop):
        def preempt(self, job_id: str, for_job: str, resumes: bool = False) -> bool:
            assert not resumes  # the just-started rule: the victim had no checkpoint yet
            stopped.append((job_id, for_job))
            return True

        def _place(self, placements: list[has.Placement]) -> list[tuple[has.Placement, bool, str]]:
            reserved.extend(p.job_id for p in placements)
            return [(p, True, "") for p in placements]

    service = _service(Loop, _FakeStore(queue, view.cluster, running), policy.queue_policy)
    report = service.tick(now=20.0)
    assert stopped == [("long", "short")] and report.preempted == ["long for short"]
    assert reserved == []  # its GPUs are still the victim's until the agents report the exit


def test_live_scheduler_stops_a_long_job_as_the_simulator_does() -> None:
    """The default policy's long-job stop: a job with hours left holds both nodes when two much
    shorter ones arrive; the simulator stops it (keeping its progress) and starts what takes its
    GPUs; the service's tick, given the same cluster, queue and running job (resumable), stops
    the same job for the same takers and places none of them until its GPUs are back."""
    import has
    from frenzy.scheduler.loop import SchedulerLoop

    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8, "name_prefix": "h100"}]})
    trace = [TraceJob("long", 0.0, "qwen2.5-32b", 2048, 64, 4_000_000_000, 16),
             TraceJob("short0", 3600.0, "qwen2.5-32b", 2048, 64, 2_000_000, 8),
             TraceJob("short1", 3600.0, "qwen2.5-32b", 2048, 64, 2_000_000, 8)]  # fmt: skip
    policy = FrenzyPolicy("frenzy", QueuePolicy.frenzy())
    sim = Simulator(spec, trace, policy, runtime_noise=0.0)
    sim._handle(0.0, 0, "long", 0)
    sim._decide(0.0)
    assert "long" in sim.running and len(sim.owner) == 16
    for j in trace[1:]:
        sim._handle(3600.0, 0, j.job_id, 0)
    view = SimView(sim, 3600.0)
    actions = policy.decide(view)
    kinds = [(type(a).__name__, a.job_id) for a in actions]
    assert kinds[0] == ("Stop", "long") and not actions[0].lose_progress, kinds
    sim_starts = sorted(a.job_id for a in actions if isinstance(a, Start))
    assert sim_starts and set(sim_starts) <= {"short0", "short1"}
    queue = [policy.queued_job(j) for j in view.queue]
    running = [RunningJob(j.job_id, j.started_at, j.submitted_at) for j in view.running]

    stopped: list[tuple[str, str, bool]] = []
    reserved: list[str] = []

    class Loop(SchedulerLoop):
        def preempt(self, job_id: str, for_job: str, resumes: bool = False) -> bool:
            stopped.append((job_id, for_job, resumes))
            return True

        def _place(self, placements: list[has.Placement]) -> list[tuple[has.Placement, bool, str]]:
            reserved.extend(p.job_id for p in placements)
            return [(p, True, "") for p in placements]

    store = _FakeStore(queue, view.cluster, running)
    service = _service(Loop, store, QueuePolicy.frenzy())
    report = service.tick(now=3600.0)
    assert [(j, r) for j, _, r in stopped] == [("long", True)] and stopped[0][1] in sim_starts
    assert len(report.preempted) == 1
    assert reserved == []  # every taker waits for the victim's exit, as the loop reports
    assert sorted(j for j in store.reasons if store.reasons[j].startswith("starting once long")) == sim_starts
