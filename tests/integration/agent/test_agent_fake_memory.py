"""Fake GPUs show a running job's predicted memory (the launch's ``peak_bytes_per_gpu``) as used,
as NVML would show its allocations, and free again once it ended — what `frenzy nodes` and the
dashboard display during the demo."""

from __future__ import annotations

from integration.agent.agent_cluster import NODE, SLEEPER, Cluster, wait_for

from frenzy.common.messages import CancelMessage, EventKind, LayoutEnv

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
