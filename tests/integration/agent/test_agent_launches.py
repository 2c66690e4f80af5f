"""The agent's launches against a real Redis: log shipping (exactly once, across restarts), the crash window
between starting a process and recording it, stragglers outside the process group, rendezvous ports,
job environment and log directories, NVML-backed registration and heartbeats, and the drain command."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from integration.agent.agent_cluster import NODE, Cluster, wait_for
from unit.agent.agent_fake_nvml import Device, FakeNvml, NvLink, Proc

from frenzy.agent import launcher
from frenzy.agent.drain import drain
from frenzy.agent.gpus import NvmlBackend
from frenzy.state.keys import AGENT_GROUP, Keys
from frenzy.state.messages import CancelMessage, EventKind, decode_log_chunk

GiB = 2**30


def stream_text(cluster: Cluster, job_id: str) -> str:
    return "".join(decode_log_chunk(f).text for _id, f in cluster.client.xrange(cluster.keys.job_logs(job_id, NODE)))


# ---------------------------------------------------------------- logs into Redis

def test_output_is_shipped_to_the_job_log_stream_before_the_exit_is_reported(cluster: Cluster) -> None:
    cluster.start()
    cluster.launch("job-log", [sys.executable, "-c", "import sys; print('to stdout'); print('to stderr', file=sys.stderr);"
                                                     "sys.stdout.write('no newline at the end')"])
    exited = cluster.wait_event("job-log", EventKind.EXITED)
    text = stream_text(cluster, "job-log")  # complete as soon as the exit is reported
    assert "to stdout\n" in text and "to stderr\n" in text and "no newline at the end" in text
    assert "exited with code 0" in text
    size = os.path.getsize(exited.log_path)
    assert cluster.client.hget(cluster.keys.job_log_offsets("job-log", NODE), f"{NODE}/1") == str(size)
    assert text.encode() == Path(exited.log_path).read_bytes()  # every byte, once


def test_a_restarted_agent_resumes_shipping_without_duplicates(cluster: Cluster, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = ("import pathlib, time\nfor i in range(3): print('line', i, flush=True)\n"
            f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.02)\n"
            "for i in range(3, 6): print('line', i, flush=True)\n")
    first = cluster.start()
    cluster.launch("job-r", [sys.executable, "-c", code])
    wait_for(lambda: "line 2\n" in stream_text(cluster, "job-r"), what="first lines shipped")
    first.halt()
    go.touch()  # more output while no agent ships it
    cluster.start()
    exited = cluster.wait_event("job-r", EventKind.EXITED)
    lines = [ln for ln in stream_text(cluster, "job-r").splitlines() if ln.startswith("line")]
    assert lines == [f"line {i}" for i in range(6)] and exited.exit_code == 0


def test_a_relaunch_into_a_log_already_shipped_adds_only_its_own_output(cluster: Cluster) -> None:
    # A new log file is shipped from 0 without asking Redis (nothing of it can have been sent);
    # an attempt started again on this node appends to its old file, whose start went already.
    old = "# output of an earlier start of this attempt\n"
    path = cluster.log_dir / "job-again" / "attempt-1" / f"{NODE}.log"
    path.parent.mkdir(parents=True)
    path.write_text(old)
    cluster.client.xadd(cluster.keys.job_logs("job-again", NODE), {"data": json.dumps(
        {"node": NODE, "attempt": 1, "offset": 0, "text": old})})
    cluster.client.hset(cluster.keys.job_log_offsets("job-again", NODE), f"{NODE}/1", len(old))
    cluster.start()
    cluster.launch("job-again", [sys.executable, "-c", "print('second start')"])
    exited = cluster.wait_event("job-again", EventKind.EXITED)
    text = stream_text(cluster, "job-again")
    assert text.count(old) == 1 and "second start\n" in text
    assert text.encode() == Path(exited.log_path).read_bytes()  # every byte of the file, once


# ---------------------------------------------------------------- no doubled launch

@pytest.mark.parametrize("spawned", [True, False], ids=["spawner", "exec"])
def test_a_process_started_just_before_a_crash_is_adopted_not_started_again(cluster: Cluster, spawned: bool) -> None:
    c, k = cluster.client, cluster.keys
    stream = k.launch_stream(NODE)
    c.xgroup_create(stream, AGENT_GROUP, id="0", mkstream=True)
    msg = cluster.launch("job-w", [sys.executable, "-c", "import time; print('once', flush=True); time.sleep(30)"])
    # A previous agent run read the launch, started the process, and died before writing its ledger
    # or acknowledging: the entry is pending and only /proc knows the process.
    assert c.xreadgroup(AGENT_GROUP, NODE, {stream: ">"}, count=10)
    started = launcher.start(msg, NODE, cluster.log_dir.resolve(), launch_id=f"{k.prefix}/{NODE}/job-w/1",
                             spawner=None if spawned else False)
    try:
        running = cluster.start()
        event = cluster.wait_event("job-w", EventKind.RUNNING)
        assert event.pid == started.proc.pid and event.fence == 1
        if spawned:  # the spawner's shim is found by the pid file written before anyone heard of it
            assert launcher.spawned_pid(started.log_path) == started.proc.pid
        else:  # an exec'd shim by its marker in /proc
            assert launcher.find_processes(f"{k.prefix}/{NODE}/job-w/1", shim_only=True) == [started.proc.pid]
        assert cluster.pending() == 0
        assert [j.pid for j in running.agent.running_jobs()] == [started.proc.pid]
        # The command has started (its shim's signal handlers are in place): a cancel that
        # lands while the shim's interpreter is still starting kills it before it can record
        # a status, which is not the case this test is about.
        wait_for(lambda: "once" in Path(event.log_path).read_text().splitlines(), what="the adopted job's first output")
        cluster.send(CancelMessage(job_id="job-w", attempt=1))
        exited = cluster.wait_event("job-w", EventKind.EXITED)
        assert exited.cancelled and exited.exit_code == -signal.SIGTERM
        assert Path(exited.log_path).read_text().count("job job-w attempt 1 at") == 1
    finally:
        launcher.kill_launch(f"{k.prefix}/{NODE}/job-w/1", signal.SIGKILL)
        started.proc.wait(timeout=10)


# ---------------------------------------------------------------- processes outside the group

DETACHED = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " start_new_session=True); print('spawned', flush=True); time.sleep({sleep})")


def test_stragglers_outside_the_group_die_with_the_job(cluster: Cluster) -> None:
    cluster.start()
    cluster.launch("job-s", [sys.executable, "-c", DETACHED.format(sleep=0.3)])
    assert cluster.wait_event("job-s", EventKind.EXITED).exit_code == 0
    wait_for(lambda: not launcher.find_processes(f"{cluster.keys.prefix}/{NODE}/job-s/1"), what="straggler killed")


def test_cancel_reaches_processes_that_left_the_group(cluster: Cluster) -> None:
    cluster.start()
    cluster.launch("job-d", [sys.executable, "-c", DETACHED.format(sleep=60)])
    launch_id = f"{cluster.keys.prefix}/{NODE}/job-d/1"
    # (the command and its detached child carry the launch id; the spawner's shim does not)
    wait_for(lambda: len(launcher.find_processes(launch_id)) >= 2, what="job with a detached child")
    cluster.send(CancelMessage(job_id="job-d", attempt=1))
    assert cluster.wait_event("job-d", EventKind.EXITED).cancelled
    wait_for(lambda: not launcher.find_processes(launch_id), what="every process of the job gone")


# ---------------------------------------------------------------- rendezvous port, env, log dir

def test_a_foreign_process_on_the_rendezvous_port_is_a_retryable_launch_failure(cluster: Cluster) -> None:
    cluster.start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cluster.launch("job-p", [sys.executable, "-c", "pass"], nnodes=2, master_port=port)
        event = cluster.wait_event("job-p", EventKind.LAUNCH_FAILED)
    assert event.retryable and f"rendezvous port {port} on node {NODE} is in use" in event.message
    # Another node rank does not own the port: it is not checked there.
    cluster.launch("job-q", [sys.executable, "-c", "pass"], nnodes=2, node_rank=1, master_port=port, fence=2)
    assert cluster.wait_event("job-q", EventKind.EXITED).exit_code == 0


def test_agent_env_and_job_env_reach_the_job_and_its_log_is_in_the_agents_log_dir(cluster: Cluster) -> None:
    cluster.start(extra_env={"NCCL_SOCKET_IFNAME": "ib0", "SITE": "agent"})
    code = "import os; print(os.environ['NCCL_SOCKET_IFNAME'], os.environ['SITE'], os.environ['RUN'])"
    cluster.launch("job-e", [sys.executable, "-c", code], env={"SITE": "job", "RUN": "{job_id}-{attempt}"})
    exited = cluster.wait_event("job-e", EventKind.EXITED)
    assert exited.log_path == str(cluster.log_dir.resolve() / "job-e" / "attempt-1" / f"{NODE}.log")
    assert "ib0 job job-e-1\n" in Path(exited.log_path).read_text()


# ---------------------------------------------------------------- NVML-backed agent

def _nvml() -> FakeNvml:
    return FakeNvml(devices=[
        Device("NVIDIA A100-SXM4-80GB", "GPU-a", 80 * GiB, 80 * GiB, bus_id="00000000:07:00.0",
               nvlinks=[NvLink("00000000:0F:00.0")] * 12),
        Device("NVIDIA A100-SXM4-80GB", "GPU-b", 80 * GiB, 80 * GiB, bus_id="00000000:0F:00.0",
               nvlinks=[NvLink("00000000:07:00.0")] * 12),
    ])


def test_an_nvml_agent_registers_topology_and_heartbeats_live_state(cluster: Cluster) -> None:
    nvml = _nvml()
    cluster.start(backend=NvmlBackend(nvml))
    c, k = cluster.client, cluster.keys
    gpu0 = c.hgetall(k.gpu(NODE, 0))
    assert (gpu0["uuid"], gpu0["type"], gpu0["pci_bus_id"]) == ("GPU-a", "A100-80GB", "00000000:07:00.0")
    assert json.loads(gpu0["links"]) == {"1": "NV12"} and gpu0["healthy"] == "1"
    # A process the scheduler did not start takes memory: the next heartbeats say so.
    nvml.devices[1].free = 30 * GiB
    nvml.devices[1].processes = [Proc(999, 50 * GiB)]
    nvml.devices[1].utilization = 100
    wait_for(lambda: c.hget(k.gpu(NODE, 1), "memory_free") == str(30 * GiB), what="free memory heartbeat")
    gpu1 = c.hgetall(k.gpu(NODE, 1))
    assert json.loads(gpu1["processes"]) == [[999, 50 * GiB]] and gpu1["utilization"] == "100"
    # A GPU falls off the bus: unhealthy with the reason; then NVML goes away entirely: the node says why.
    nvml.devices[0].lost = True
    wait_for(lambda: c.hget(k.gpu(NODE, 0), "healthy") == "0", what="lost GPU unhealthy")
    assert "NVML_ERROR_GPU_IS_LOST" in c.hget(k.gpu(NODE, 0), "health_reason")
    assert c.hget(k.node(NODE), "health_reason") == ""  # the other GPU still works
    nvml.down_error = nvml.NVML_ERROR_DRIVER_NOT_LOADED
    wait_for(lambda: "driver not loaded" in (c.hget(k.node(NODE), "health_reason") or ""), what="node health")
    assert c.hget(k.gpu(NODE, 1), "healthy") == "0" and c.exists(k.node_alive(NODE))  # alive, not schedulable
    nvml.down_error = None
    nvml.devices[0].lost = False
    wait_for(lambda: c.hget(k.gpu(NODE, 0), "healthy") == c.hget(k.gpu(NODE, 1), "healthy") == "1",
             what="recovery")
    assert c.hget(k.node(NODE), "health_reason") == ""


# ---------------------------------------------------------------- drain

def test_drain_waits_for_running_jobs_and_undrain_reopens(cluster: Cluster, redis_url: str, keys: Keys) -> None:
    cluster.start()
    c = cluster.client
    said: list[str] = []
    assert drain(redis_url, keys, "ghost", say=said.append) == 4 and "no node 'ghost'" in said[-1]
    assert not c.exists(keys.node("ghost"))
    c.hset(keys.gpu(NODE, 1), "owner", "job-busy")
    assert drain(redis_url, keys, NODE, wait=False, say=said.append) == 0
    assert c.hget(keys.node(NODE), "draining") == "1" and "1 job(s) still running" in said[-1]
    assert drain(redis_url, keys, NODE, timeout_s=0.3, poll_s=0.05, say=said.append) == 1
    assert "still running on n1: job-busy" in said[-1]
    threading.Timer(0.3, lambda: c.hset(keys.gpu(NODE, 1), "owner", "")).start()
    t0 = time.monotonic()
    assert drain(redis_url, keys, NODE, poll_s=0.05, say=said.append) == 0
    assert time.monotonic() - t0 >= 0.25 and "  job-busy finished" in said and said[-1].endswith("is drained: "
                                                                                               "no job holds its GPUs")
    assert drain(redis_url, keys, NODE, undrain=True, say=said.append) == 0
    assert c.hget(keys.node(NODE), "draining") == "0"


def test_drain_survives_an_agent_restart(cluster: Cluster, redis_url: str, keys: Keys) -> None:
    first = cluster.start()
    assert drain(redis_url, keys, NODE, wait=False, say=lambda _m: None) == 0
    first.halt()
    cluster.start()
    assert cluster.client.hget(keys.node(NODE), "draining") == "1"
