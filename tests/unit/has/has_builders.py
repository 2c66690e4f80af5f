"""Small builders for HAS tests: clusters, plans and queued jobs in one line each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from has import ClusterView, GpuSlot, NodeView, PlanOption, QueuedJob

GiB = 1 << 30
A100 = "A100-80GB"
H100 = "H100-80GB"
L4 = "L4-24GB"
MEM = {A100: 80 * GiB, H100: 80 * GiB, L4: 24 * GiB}


def node(
    name: str,
    gpu_type: str = A100,
    n: int = 8,
    busy: Iterable[int] = (),
    owner: str = "running",
    mem_free: Mapping[int, int] | None = None,
    unhealthy: Iterable[int] = (),
    alive: bool = True,
    draining: bool = False,
) -> NodeView:
    """A node of ``n`` GPUs; ``busy`` indices are owned by ``owner``; the rest are free."""
    total = MEM.get(gpu_type, 80 * GiB)
    busy_set = set(busy)
    sick = set(unhealthy)
    mem_free = dict(mem_free or {})
    gpus = tuple(
        GpuSlot(
            node=name,
            index=i,
            gpu_type=gpu_type,
            memory_total=total,
            memory_free=mem_free.get(i, 1 * GiB if i in busy_set else total),
            owner=owner if i in busy_set else None,
            healthy=i not in sick,
        )
        for i in range(n)
    )
    return NodeView(name=name, gpus=gpus, alive=alive, draining=draining)


def free_node(name: str, free: int, n: int = 8, gpu_type: str = A100) -> NodeView:
    """A node with exactly ``free`` free GPUs (the highest indices are busy)."""
    return node(name, gpu_type, n, busy=range(free, n))


def cluster(*nodes: NodeView) -> ClusterView:
    return ClusterView(list(nodes))


def plan(gpu_type: str = A100, tp: int = 1, pp: int = 1, dp: int = 1, gib: float = 10.0) -> PlanOption:
    return PlanOption(gpu_type=gpu_type, tp=tp, pp=pp, dp=dp, bytes_per_gpu=int(gib * GiB))


def job(job_id: str, seq: int, *plans: PlanOption, at: float = 0.0) -> QueuedJob:
    return QueuedJob(job_id=job_id, seq=seq, submitted_at=at, plans=tuple(plans))
