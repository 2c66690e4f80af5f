"""Fake GPUs show a running job's predicted memory (the launch's ``peak_bytes_per_gpu``) as used,
as NVML would show its allocations, and free again once it ended — what `frenzy nodes` and the
dashboard display during the demo."""

from __future__ import annotations

from integration.agent.agent_cluster import NODE, SLEEPER, Cluster, wait_for

from frenzy.state.messages import CancelMessage, EventKind, LayoutEnv

GiB = 1024**3


def _free(cluster: Cluster, index: int) -> int:
    return int(cluster.client.hget(cluster.keys.gpu(NODE, index), "memory_free"))


def test_a_running_job_uses_its_predicted_memory_on_fake_gpus(cluster: Cluster) -> None:
    cluster.start()
    total = [int(cluster.client.hget(cluster.keys.gpu(NODE, i), "memory_total")) for i in range(3)]
    layout = LayoutEnv(gpu_type="A100-80GB", tp=2, pp=1, dp=1, zero_stage=0, micro_batch=1, grad_accum=1,
                       peak_bytes_per_gpu=30 * GiB)
    cluster.launch("job-m", SLEEPER, indices=[0, 1], layout=layout)
    cluster.wait_event("job-m", EventKind.RUNNING)
    wait_for(lambda: [_free(cluster, i) for i in range(3)] == [total[0] - 30 * GiB, total[1] - 30 * GiB, total[2]],
             what="the job's memory shown on GPUs 0 and 1 only")
    assert cluster.client.hget(cluster.keys.gpu(NODE, 0), "utilization") == "100"
    cluster.send(CancelMessage(job_id="job-m", attempt=1, reason="test"))
    cluster.wait_event("job-m", EventKind.EXITED)
    wait_for(lambda: [_free(cluster, i) for i in range(3)] == total, what="the memory free again")


def test_an_adopted_job_still_shows_its_memory_after_an_agent_restart(cluster: Cluster) -> None:
    """The ledger keeps a job's GPUs and predicted memory, so a restarted agent that adopts the
    job goes on showing it (before, the adopted job's GPUs read as empty until it ended)."""
    first = cluster.start()
    total = [int(cluster.client.hget(cluster.keys.gpu(NODE, i), "memory_total")) for i in range(3)]
    layout = LayoutEnv(gpu_type="A100-80GB", tp=1, pp=1, dp=1, zero_stage=0, micro_batch=1, grad_accum=1,
                       peak_bytes_per_gpu=20 * GiB)
    cluster.launch("job-r", SLEEPER, indices=[1], layout=layout)
    cluster.wait_event("job-r", EventKind.RUNNING)
    shown = [total[0], total[1] - 20 * GiB, total[2]]
    wait_for(lambda: [_free(cluster, i) for i in range(3)] == shown, what="the job's memory on GPU 1")
    first.halt()  # without --kill-on-exit the job keeps running
    second = cluster.start()
    assert [j.job_id for j in second.agent.running_jobs()] == ["job-r"]
    # A fresh fake backend starts with every GPU free; the heartbeat must show the job again.
    first_beat = float(cluster.client.hget(cluster.keys.node(NODE), "heartbeat_at"))
    wait_for(lambda: float(cluster.client.hget(cluster.keys.node(NODE), "heartbeat_at")) > first_beat,
             what="a heartbeat of the restarted agent")
    wait_for(lambda: [_free(cluster, i) for i in range(3)] == shown, what="the adopted job's memory on GPU 1")
    cluster.send(CancelMessage(job_id="job-r", attempt=1, reason="test"))
    cluster.wait_event("job-r", EventKind.EXITED)
    wait_for(lambda: [_free(cluster, i) for i in range(3)] == total, what="the memory free again")
