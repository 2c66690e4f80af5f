"""The node agent against a real Redis: registration, heartbeat, lease, launch, exit, cancel, restart.

Each test runs ``Agent.run`` in a thread with fake GPUs and short timings, and
waits on Redis with deadlines (never an unbounded loop).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis
from integration.agent.agent_cluster import NODE, SLEEPER, Cluster, wait_for

from frenzy.agent import launcher
from frenzy.state import node_keys, scripts
from frenzy.state.keys import AGENT_GROUP, Keys
from frenzy.state.messages import CancelMessage, EventKind

# ---------------------------------------------------------------- registration, heartbeat, lease

def test_registration_writes_node_gpus_set_and_lease(cluster: Cluster) -> None:
    cluster.start(addr="10.1.2.3")
    c, k = cluster.client, cluster.keys
    node = c.hgetall(k.node(NODE))
    assert node["name"] == NODE and node["addr"] == "10.1.2.3"
    assert node["gpu_count"] == "3" and node["gpu_types"] == "A100-80GB,L4"
    assert node["draining"] == "0" and node["agent_pid"] == str(os.getpid())
    assert float(node["registered_at"]) > 1e9 and float(node["heartbeat_at"]) >= float(node["registered_at"])
    assert c.smembers(k.nodes()) == {NODE}
    assert 0 < c.pttl(k.node_alive(NODE)) <= 2000
    gpu = c.hgetall(k.gpu(NODE, 2))
    assert gpu == {
        "node": NODE, "index": "2", "uuid": f"GPU-fake-{NODE}-2", "type": "L4", "nvml_name": gpu["nvml_name"],
        "memory_total": gpu["memory_total"], "memory_free": gpu["memory_total"], "healthy": "1",
        "health_reason": "", "pci_bus_id": "", "links": "{}", "utilization": "-1", "processes": "[]",
        "type_from_memory": "0", "owner": "", "fence": "0",
    }
    assert int(gpu["memory_total"]) > 20 * 2**30


def test_reregistration_keeps_owner_fence_and_draining(cluster: Cluster) -> None:
    c, k = cluster.client, cluster.keys
    c.hset(k.gpu(NODE, 0), mapping={"owner": "job-x", "fence": "9", "memory_free": "1"})
    c.hset(k.node(NODE), mapping={"draining": "1"})
    cluster.start()
    gpu0 = c.hgetall(k.gpu(NODE, 0))
    assert gpu0["owner"] == "job-x" and gpu0["fence"] == "9"
    assert gpu0["uuid"] == f"GPU-fake-{NODE}-0" and gpu0["memory_free"] == gpu0["memory_total"]
    assert c.hget(k.gpu(NODE, 1), "owner") == "" and c.hget(k.node(NODE), "draining") == "1"


def test_heartbeat_refreshes_memory_and_reregisters_a_lost_node(cluster: Cluster) -> None:
    c, k = cluster.client, cluster.keys
    cluster.start()
    first = float(c.hget(k.node(NODE), "heartbeat_at"))
    c.hset(k.gpu(NODE, 1), "memory_free", "0")
    wait_for(lambda: c.hget(k.gpu(NODE, 1), "memory_free") == c.hget(k.gpu(NODE, 1), "memory_total"),
             what="heartbeat to rewrite memory_free")
    assert float(c.hget(k.node(NODE), "heartbeat_at")) > first
    c.delete(k.node(NODE), k.gpu(NODE, 0))  # Redis lost data
    wait_for(lambda: c.exists(k.node(NODE), k.gpu(NODE, 0)) == 2, what="re-registration")


def test_lease_expires_after_the_agent_stops_but_the_node_stays(cluster: Cluster) -> None:
    c, k = cluster.client, cluster.keys
    running = cluster.start(ttl_s=1.0)
    time.sleep(1.3)  # outlives one TTL: only heartbeats keep the lease
    assert c.exists(k.node_alive(NODE))
    running.halt()
    wait_for(lambda: not c.exists(k.node_alive(NODE)), timeout=3, what="lease expiry")
    assert c.exists(k.node(NODE)) and c.sismember(k.nodes(), NODE)


def test_scripts_reject_malformed_calls_and_heartbeat_never_creates_a_node(
        redis_client: redis.Redis, keys: Keys) -> None:
    c = redis_client
    register = scripts.register(c, "register_node")
    heartbeat = scripts.register(c, "heartbeat")
    with pytest.raises(redis.ResponseError, match="1 GPU keys but 2 GPU fields"):
        register(keys=[keys.node("x"), keys.nodes(), keys.node_alive("x"), keys.gpu("x", 0)],
                 args=["x", "a", "", 1, 1000, "i", "", "", 0, "u"])
    assert c.exists(keys.node("x"), keys.nodes(), keys.gpu("x", 0)) == 0
    assert heartbeat(keys=[keys.node("x"), keys.node_alive("x")], args=[1000, "i", ""]) == 0
    assert c.exists(keys.node_alive("x")) == 0


# ---------------------------------------------------------------- launch and exit

@pytest.mark.parametrize("use_spawner", [True, False], ids=["spawner", "exec"])
def test_launch_reports_running_then_exited_and_logs_output(cluster: Cluster, use_spawner: bool) -> None:
    cluster.start(use_spawner=use_spawner)
    cmd = [sys.executable, "-c",
           "import os;print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['FRENZY_TP'], '{tp}/{job_id}')"]
    cluster.launch("job-ok", cmd, indices=[0, 1])
    exited = cluster.wait_event("job-ok", EventKind.EXITED)
    running, done = cluster.events("job-ok")
    assert running.kind == EventKind.RUNNING and running.pid and running.node == NODE
    assert done == exited and exited.exit_code == 0 and not exited.cancelled and exited.pid == running.pid
    log = Path(running.log_path)
    assert log == cluster.log_dir.resolve() / "job-ok" / "attempt-1" / f"{NODE}.log"
    assert "0,1 2 2/job-ok\n" in log.read_text()
    assert "exited with code 0" in log.read_text()
    assert cluster.pending() == 0


def test_failing_command_exits_non_zero(cluster: Cluster) -> None:
    cluster.start()
    cluster.launch("job-bad", [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert cluster.wait_event("job-bad", EventKind.EXITED).exit_code == 3


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"command": ["/nonexistent/train.sh"]}, "command not found: '/nonexistent/train.sh'"),
        ({"command": [sys.executable], "workdir": f"{tempfile.gettempdir()}/frenzy-nonexistent/dir"},
         f"working directory '{tempfile.gettempdir()}/frenzy-nonexistent/dir' does not exist"),
        ({"command": [sys.executable], "indices": [7]}, "GPU index(es) [7] do not exist"),
        ({"command": [sys.executable], "gpu_uuids": ["GPU-other", "GPU-fake-n1-1"]},
         "GPU 0 on node n1 is GPU-fake-n1-0, but the launch expects GPU-other"),
        ({"command": [sys.executable], "node": "n2"}, "launch addressed to node 'n2' arrived at node 'n1'"),
    ],
)
def test_launch_that_cannot_start_reports_launch_failed(cluster: Cluster, fields: dict, expected: str) -> None:
    cluster.start()
    cluster.launch("job-nope", **fields)
    event = cluster.wait_event("job-nope", EventKind.LAUNCH_FAILED)
    assert expected in event.message
    assert [e.kind for e in cluster.events("job-nope")] == [EventKind.LAUNCH_FAILED]
    wait_for(lambda: cluster.pending() == 0, what="ack")


def test_stale_fence_is_refused(cluster: Cluster) -> None:
    cluster.start()
    cluster.reserve("job-new", 8, [0, 1])
    cluster.launch("job-old", SLEEPER, fence=5, reserve=False)
    event = cluster.wait_event("job-old", EventKind.LAUNCH_FAILED)
    assert "stale launch: GPU 0 is held by 'job-new' with fence 8" in event.message


def test_repeated_launch_of_a_running_job_starts_nothing(cluster: Cluster) -> None:
    running = cluster.start()
    msg = cluster.launch("job-dup", SLEEPER)
    cluster.wait_event("job-dup", EventKind.RUNNING)
    cluster.send(msg)
    wait_for(lambda: cluster.pending() == 0 and cluster.client.xlen(cluster.keys.launch_stream(NODE)) == 2,
             what="second launch handled")
    time.sleep(0.2)
    assert [e.kind for e in cluster.events("job-dup")] == [EventKind.RUNNING]
    assert len(running.agent.running_jobs()) == 1


# ---------------------------------------------------------------- cancel

def test_cancel_terminates_the_process_group_within_the_grace(cluster: Cluster) -> None:
    cluster.start(cancel_grace_s=5.0)
    # The job forks a grandchild into its process group; cancel must end both.
    cmd = [sys.executable, "-c",
           "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time;time.sleep(60)']);"
           "print('up', flush=True); time.sleep(60)"]
    cluster.launch("job-c", cmd)
    pid = cluster.wait_event("job-c", EventKind.RUNNING).pid
    wait_for(lambda: "\nup\n" in Path(cluster.events("job-c")[0].log_path).read_text(), what="job up")
    t0 = time.monotonic()
    cluster.send(CancelMessage(job_id="job-c", attempt=1, reason="user asked"))
    exited = cluster.wait_event("job-c", EventKind.EXITED, timeout=5.0)
    assert time.monotonic() - t0 < 5.0
    assert exited.cancelled and exited.exit_code == -signal.SIGTERM
    wait_for(lambda: not launcher.group_exists(pid), timeout=3, what="process group gone")


def test_cancel_escalates_to_sigkill_after_the_grace(cluster: Cluster) -> None:
    cluster.start(cancel_grace_s=0.5)
    cmd = [sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
           "print('deaf', flush=True); time.sleep(60)"]
    cluster.launch("job-deaf", cmd)
    running = cluster.wait_event("job-deaf", EventKind.RUNNING)
    wait_for(lambda: "\ndeaf\n" in Path(running.log_path).read_text(), what="SIGTERM ignored")
    cluster.send(CancelMessage(job_id="job-deaf", attempt=1))
    exited = cluster.wait_event("job-deaf", EventKind.EXITED, timeout=4.0)
    assert exited.cancelled and exited.exit_code == -signal.SIGKILL


def test_cancel_for_an_unknown_job_is_acked_quietly(cluster: Cluster) -> None:
    cluster.start()
    cluster.send(CancelMessage(job_id="ghost", attempt=1))
    cluster.launch("job-after", [sys.executable, "-c", "pass"])
    cluster.wait_event("job-after", EventKind.EXITED)
    assert cluster.events("ghost") == [] and cluster.pending() == 0


# ---------------------------------------------------------------- bad input and restarts

def test_garbage_entries_are_acked_and_the_next_message_still_runs(cluster: Cluster, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="frenzy.agent.daemon")
    cluster.start()
    bad1 = cluster.send({"foo": "bar"})
    bad2 = cluster.send({"data": '{"kind": "launch", "job_id": 5'})
    bad3 = cluster.send({"data": '{"kind": "reboot"}'})
    cluster.launch("job-good", [sys.executable, "-c", "print('fine')"])
    assert cluster.wait_event("job-good", EventKind.EXITED).exit_code == 0
    wait_for(lambda: cluster.pending() == 0, what="all acked")
    text = caplog.text
    for entry_id in (bad1, bad2):
        assert f"skipping bad entry {entry_id}" in text
    assert f"refusing reboot {bad3} for job None: unsigned" in text  # JSON, but not signed: refused first
    assert "no 'data' field" in text


def test_pending_launch_runs_once_after_a_restart(cluster: Cluster) -> None:
    c, k = cluster.client, cluster.keys
    stream = k.launch_stream(NODE)
    c.xgroup_create(stream, AGENT_GROUP, id="0", mkstream=True)
    cluster.launch("job-p", [sys.executable, "-c", "print('once')"])
    # A previous agent run received the entry and died before acknowledging it.
    assert c.xreadgroup(AGENT_GROUP, NODE, {stream: ">"}, count=10)
    assert cluster.pending() == 1
    first = cluster.start()
    assert cluster.wait_event("job-p", EventKind.EXITED).exit_code == 0
    assert cluster.pending() == 0
    first.halt()
    cluster.start()  # ready = past its pending entries
    time.sleep(0.2)
    assert [e.kind for e in cluster.events("job-p")] == [EventKind.RUNNING, EventKind.EXITED]
    assert Path(cluster.events("job-p")[0].log_path).read_text().count("once\n") == 1


def test_restarted_agent_adopts_running_jobs(cluster: Cluster) -> None:
    first = cluster.start()
    msg = cluster.launch("job-a", SLEEPER)
    pid = cluster.wait_event("job-a", EventKind.RUNNING).pid
    first.halt()  # without --kill-on-exit the job keeps running
    assert launcher.group_exists(pid)
    cluster.send(msg)  # the scheduler (or a redelivery) repeats the launch
    second = cluster.start()
    wait_for(lambda: cluster.pending() == 0, what="repeated launch handled")
    assert [j.pid for j in second.agent.running_jobs()] == [pid]
    assert [e.kind for e in cluster.events("job-a")] == [EventKind.RUNNING]
    cluster.send(CancelMessage(job_id="job-a", attempt=1))
    exited = cluster.wait_event("job-a", EventKind.EXITED)
    # Not our child, but its shim recorded how it ended.
    assert exited.cancelled and exited.exit_code == -signal.SIGTERM
    wait_for(lambda: not launcher.group_exists(pid), timeout=3, what="process group gone")


def test_kill_on_exit_stops_jobs_and_reports_them(cluster: Cluster) -> None:
    running = cluster.start(kill_on_exit=True, cancel_grace_s=2.0)
    cluster.launch("job-k", SLEEPER)
    pid = cluster.wait_event("job-k", EventKind.RUNNING).pid
    running.halt()
    exited = cluster.wait_event("job-k", EventKind.EXITED, timeout=1.0)
    assert exited.exit_code == -signal.SIGTERM and "--kill-on-exit" in exited.message
    assert not launcher.process_running(pid, None)


# ---------------------------------------------------------------- the command line

def test_cli_runs_registers_and_stops_on_sigterm(redis_url: str, redis_client: redis.Redis, keys: Keys,
                                                 tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "frenzy.agent", "--node", "cli-n", "--fake-gpus", "L4:2",
           "--redis-url", redis_url, "--prefix", keys.prefix, "--heartbeat-s", "0.2", "--ttl-s", "2",
           "--log-dir", str(tmp_path)]
    # No signing key yet: the agent does not start, and says how to make one.
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "To fix: frenzy node key create cli-n" in refused.stderr
    assert not redis_client.exists(keys.node("cli-n"))
    node_keys.create(redis_client, keys, "cli-n")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: redis_client.exists(keys.node_alive("cli-n")) or proc.poll() is not None,
                 timeout=15, what="CLI agent registered")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert redis_client.hget(keys.node("cli-n"), "gpu_types") == "L4"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert "registered node cli-n" in output and "stopped" in output


@pytest.mark.parametrize("use_spawner", [True, False], ids=["spawner", "exec"])
def test_a_job_that_leaves_a_detached_child_exits_once_and_leaves_nothing(cluster: Cluster, use_spawner: bool) -> None:
    # Either way of starting the shim ends the stragglers: the spawner's shim by itself (a child
    # subreaper), the exec'd one's by the agent's search of /proc.
    running = cluster.start(use_spawner=use_spawner)
    code = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " start_new_session=True); print('left one behind', flush=True)")
    cluster.launch("job-left", [sys.executable, "-c", code])
    exited = cluster.wait_event("job-left", EventKind.EXITED)
    assert exited.exit_code == 0
    assert cluster.events("job-left")[-1] == exited
    launch_id = running.agent.launch_id("job-left", 1)
    wait_for(lambda: not launcher.find_processes(launch_id), what="the detached child gone")
