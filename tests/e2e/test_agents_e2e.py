"""Node agents end to end, as separate processes (LocalStack): a real 2-node torchrun job over gloo,
cancel, one rank failing, an agent SIGKILLed mid-job (node declared dead, job requeued elsewhere), and
an agent restart (no lost or doubled launch).

Fake GPUs, real everything else: Redis, predictor, scheduler and agents are subprocesses talking over
loopback; the jobs are real processes (torchrun and PyTorch on CPU). Timings are short (heartbeat 0.25 s,
lease 1-3 s) and every wait has a deadline.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from frenzy.agent import launcher
from frenzy.devstack.stack import LocalStack
from frenzy.rpc.auth import with_token
from frenzy.rpc.jobspec import parse_entry
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from has.cluster_spec import parse_cluster
from support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TRAIN_TINY = ROOT / "examples" / "train_tiny.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
DONE = (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED)
# Two hosts with one 22.5 GiB L4 each. A 1.5 B-parameter model with AdamW needs ~25 GiB for weights,
# gradients and optimizer states alone, so no plan fits one GPU: the job must span both nodes.
TWO_L4_NODES = {"nodes": [{"gpu": "L4", "count": 2, "gpus_per_node": 1, "name_prefix": "l4"}]}
TWO_NODE_MODEL = {"model": "qwen2.5-1.5b", "seq_len": 512, "global_batch": 8, "max_gpus": 2}
ONE_GPU_MODEL = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "max_gpus": 1}


def launch_processes(prefix: str) -> list[int]:
    """Every live process started for a job of this stack (they carry FRENZY_LAUNCH_ID=prefix/...)."""
    needle = f"\0{launcher.LAUNCH_ID_VAR}={prefix}/".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in b"\0" + fh.read() and launcher.process_running(int(entry), None):
                    found.append(int(entry))
        except OSError:
            continue
    return found


class Stack:
    def __init__(self, stack: LocalStack, prefix: str) -> None:
        self.stack, self.prefix = stack, prefix
        self.channel = grpc.insecure_channel(stack.scheduler_addr)
        self.stub = scheduler_pb2_grpc.SchedulerStub(with_token(self.channel, stack.token))

    def submit(self, command: list[str], **entry: object) -> str:
        spec = parse_entry({"name": "e2e", **entry, "command": command}).to_proto()
        return self.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id

    def job(self, job_id: str) -> types_pb2.Job:
        return self.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)

    def wait_state(self, job_id: str, states: tuple[int, ...], timeout: float = 60) -> types_pb2.Job:
        job = wait_for(lambda: (j := self.job(job_id)).state in states and j, timeout,
                       f"{job_id} to reach {[types_pb2.JobState.Name(s) for s in states]}")
        return job  # type: ignore[return-value]

    def logs(self, job_id: str, **kw: object) -> list[scheduler_pb2.LogChunk]:
        return list(self.stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, **kw), timeout=90))

    def text(self, job_id: str, node: str = "") -> str:
        return "".join(c.text for c in self.logs(job_id, node=node))

    def nodes(self) -> list[types_pb2.Node]:
        return list(self.stub.ListNodes(scheduler_pb2.ListNodesRequest(include_dead=True), timeout=5).nodes)

    def held_gpus(self, alive_only: bool = False) -> list[str]:
        return [f"{n.name}:{g.index}={g.owner}" for n in self.nodes() for g in n.gpus
                if g.owner and (n.alive or not alive_only)]


@pytest.fixture
def make_stack(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    made: list[Stack] = []

    def make(cluster: dict, **options: object) -> Stack:
        opts = {"heartbeat_s": 0.25, "ttl_s": 3.0, "cancel_grace_s": 5.0, **options}
        s = LocalStack.create(parse_cluster(cluster), run_dir=str(tmp_path / "run"), redis_url=redis_url,
                              prefix=prefix, with_worker=False, **opts)
        s.start()
        made.append(Stack(s, prefix))
        return made[-1]

    yield make
    for s in made:
        s.channel.close()
        s.stack.stop()
    for pid in launch_processes(prefix):  # no job may outlive its test (e.g. the orphan of a killed agent)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_two_agents_run_one_torchrun_job_over_gloo(make_stack: Callable[..., Stack]) -> None:
    s = make_stack(TWO_L4_NODES)
    job_id = s.submit([TORCHRUN, str(TRAIN_TINY), "--steps", "6", "--micro-batch", "{micro_batch}"],
                      **TWO_NODE_MODEL)
    job = s.wait_state(job_id, DONE, timeout=90)
    text = s.text(job_id)
    assert job.state == types_pb2.JOB_STATE_SUCCEEDED, (job, text)
    assert sorted(a.node for a in job.placement) == ["l4-0", "l4-1"]
    assert dict(job.exit_codes) == {"l4-0": 0, "l4-1": 0}
    # Both agents started torchrun with the same rendezvous, each with its own node rank.
    port = job.master_port
    assert 29500 <= port <= 32767 and job.master_addr == "127.0.0.1"
    for rank, node in enumerate(a.node for a in job.placement):
        log = s.text(job_id, node=node)
        assert (f"--nnodes=2 --nproc-per-node=1 --node-rank={rank} --master-addr=127.0.0.1 --master-port={port} "
                f"--rdzv-id={job_id}-1 {TRAIN_TINY}") in log, log
        assert f"[rank {rank}/2 node {node}] rendezvous ok at 127.0.0.1:{port}" in log
        assert f"[rank {rank}/2 node {node}] step 5 loss " in log
    assert "ranks in sync after 6 steps" in text
    # Every GPU and the rendezvous port are free again.
    assert s.held_gpus() == []
    assert _ports_in_use(s) == []
    # `frenzy logs` shows the same output from the stream, prefixed with the node.
    import subprocess

    out = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "logs", job_id, "--follow", "--scheduler",
                          s.stack.scheduler_addr], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FRENZY_CREDENTIALS": str(s.stack.credentials_file)})
    assert out.returncode == 0, out.stderr
    assert "[l4-1] [rank 1/2 node l4-1] step 5 loss" in out.stdout and "SUCCEEDED" in out.stderr


def _ports_in_use(s: Stack) -> list[str]:
    import redis

    client = redis.Redis.from_url(s.stack.redis_url, decode_responses=True)
    try:
        return [k for k in client.keys(f"{s.prefix}:ports:*") if client.hlen(k)]
    finally:
        client.close()


def test_cancel_stops_every_process_of_a_running_torchrun_job(make_stack: Callable[..., Stack]) -> None:
    s = make_stack(TWO_L4_NODES)
    job_id = s.submit([TORCHRUN, str(TRAIN_TINY), "--steps", "100000", "--step-sleep", "0.1"], **TWO_NODE_MODEL)
    s.wait_state(job_id, (types_pb2.JOB_STATE_RUNNING,), timeout=30)
    wait_for(lambda: all(f"[rank {r}/2 node l4-{r}] step 2 loss" in s.text(job_id) for r in (0, 1)), 60,
             "both ranks training")
    pids = dict(s.job(job_id).pids)
    assert sorted(pids) == ["l4-0", "l4-1"]
    # torchrun starts each worker in a session of its own: more processes than the two groups.
    assert len(launch_processes(s.prefix)) >= 4
    t0 = time.monotonic()
    resp = s.stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="e2e"), timeout=5)
    assert resp.job.state == types_pb2.JOB_STATE_RUNNING  # stopping: ends when every node reported
    job = s.wait_state(job_id, DONE, timeout=20)
    assert job.state == types_pb2.JOB_STATE_CANCELLED, job
    assert time.monotonic() - t0 < 5.0 + 5.0  # within the agents' SIGTERM grace (+ slack)
    for pid in pids.values():
        assert not launcher.group_exists(pid)
    wait_for(lambda: not launch_processes(s.prefix), 5, "every job process gone (workers included)")
    assert s.held_gpus() == []


def test_one_rank_failing_fails_the_job_and_stops_the_other_node(make_stack: Callable[..., Stack]) -> None:
    s = make_stack(TWO_L4_NODES)
    code = ("import os, sys, time; r = int(os.environ['NODE_RANK']); print('rank', r, 'up', flush=True); "
            "time.sleep(1.0); sys.exit(3) if r == 1 else time.sleep(60)")
    job_id = s.submit([sys.executable, "-c", code], **TWO_NODE_MODEL)
    running = s.wait_state(job_id, (types_pb2.JOB_STATE_RUNNING,), timeout=30)
    wait_for(lambda: len(s.job(job_id).pids) == 2 or s.job(job_id).state in DONE, 10, "both nodes started")
    pids = dict(s.job(job_id).pids) or dict(running.pids)
    job = s.wait_state(job_id, DONE, timeout=30)
    assert job.state == types_pb2.JOB_STATE_FAILED, job
    failing = job.placement[1].node
    other = job.placement[0].node
    assert (job.failed_node, job.failed_node_rank, job.failed_exit_code) == (failing, 1, 3)
    assert job.exit_codes[failing] == 3 and job.exit_codes[other] == -signal.SIGTERM  # stopped, not failed
    assert f"node {failing} (node rank 1) failed with exit code 3" in job.history[-1].reason
    for pid in pids.values():
        assert not launcher.group_exists(pid)
    assert "rank 0 up" in s.text(job_id, node=other)
    assert s.held_gpus() == []


def test_sigkilled_agent_node_is_declared_dead_and_the_job_completes_elsewhere(
        make_stack: Callable[..., Stack]) -> None:
    s = make_stack(TWO_L4_NODES, ttl_s=1.0, node_dead_after_s=2.0)
    code = ("import os, time; a = int(os.environ['FRENZY_ATTEMPT']); "
            "print('attempt', a, 'on', os.environ['FRENZY_NODE'], flush=True); time.sleep(60 if a == 1 else 0.2)")
    job_id = s.submit([sys.executable, "-c", code], **ONE_GPU_MODEL)
    job = s.wait_state(job_id, (types_pb2.JOB_STATE_RUNNING,), timeout=30)
    (victim,) = [a.node for a in job.placement]
    survivor = "l4-1" if victim == "l4-0" else "l4-0"
    wait_for(lambda: s.job(job_id).pids and f"attempt 1 on {victim}" in s.text(job_id), 10, "attempt 1 running")
    t0 = time.monotonic()
    assert s.stack.kill_agent(victim, signal.SIGKILL) == -signal.SIGKILL
    dead = wait_for(lambda: next((n for n in s.nodes() if n.name == victim and n.declared_dead_at), None), 10,
                    f"{victim} declared dead")
    declared_after = time.monotonic() - t0
    assert 1.0 <= declared_after < 2.0 + 1.0 + 2.0, declared_after  # lease (1 s) ... timeout (2 s) + slack
    assert not dead.alive
    job = s.wait_state(job_id, DONE, timeout=30)
    assert job.state == types_pb2.JOB_STATE_SUCCEEDED, job
    assert job.attempt == 2 and [a.node for a in job.placement] == [survivor]
    reasons = [h.reason for h in job.history]
    assert any(r.startswith("requeued for attempt 2 of 3") and f"node {victim} is dead" in r for r in reasons), reasons
    text = s.text(job_id)
    assert f"attempt 1 on {victim}" in text and f"attempt 2 on {survivor}" in text
    # GPUs: the survivor's are free; the dead node's was released when its job was requeued.
    assert s.held_gpus() == []


def test_agent_restart_neither_loses_nor_doubles_a_launch(make_stack: Callable[..., Stack], tmp_path: Path) -> None:
    s = make_stack({"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 2, "name_prefix": "solo"}]},
                   ttl_s=5.0)
    go = tmp_path / "go"
    script = tmp_path / "wait_for_go.py"
    script.write_text("import os, pathlib, sys, time\n"
                      f"print('start', os.environ['FRENZY_JOB_ID'], flush=True)\n"
                      f"while not pathlib.Path({str(go)!r}).exists():\n    time.sleep(0.05)\n"
                      "print('done', flush=True)\n")
    first = s.submit([sys.executable, str(script)], **ONE_GPU_MODEL)
    s.wait_state(first, (types_pb2.JOB_STATE_RUNNING,), timeout=30)
    wait_for(lambda: f"start {first}" in s.text(first), 10, "first job up")
    s.stack.kill_agent("solo-0", signal.SIGKILL)
    # While the agent is down (its lease still alive): a second job is placed and its launch waits
    # in the node's stream; the first job finishes unobserved.
    second = s.submit([sys.executable, str(script)], **ONE_GPU_MODEL)
    s.wait_state(second, (types_pb2.JOB_STATE_LAUNCHING,), timeout=10)
    go.touch()
    wait_for(lambda: not launch_processes(s.prefix), 10, "first job ended while its agent was down")
    s.stack.start_agent("solo-0")
    for job_id in (first, second):
        job = s.wait_state(job_id, DONE, timeout=30)
        # The first job's exit status was recorded by its shim and read by the restarted agent.
        assert job.state == types_pb2.JOB_STATE_SUCCEEDED, job
        assert dict(job.exit_codes) == {"solo-0": 0}
        log = Path(job.log_paths["solo-0"]).read_text()
        assert log.count(f"job {job_id} attempt 1 at") == 1, log  # started exactly once
        assert log.count("\ndone\n") == 1
        assert s.text(job_id).splitlines().count("done") == 1  # shipped exactly once
    assert s.held_gpus() == []


@pytest.mark.parametrize(
    ("policy", "resumable", "history"),
    [(None, True, "resumes from its checkpoint"),  # the default's long-job stop
     ("frenzy-completion", False, "preempted for {short}")],  # the just-started rule
)  # fmt: skip
def test_a_long_job_is_stopped_for_a_much_shorter_one_and_runs_again_after_it(
    make_stack: Callable[..., Stack], policy: str | None, resumable: bool, history: str,
) -> None:
    """One GPU; a long job runs for days by MARP's estimate and a much shorter one arrives behind
    it: HAS stops the long one (SIGTERM to its process group), runs the short one, then starts the
    long one again (attempt 2). Under the default policy only because the long job says it
    resumes from its checkpoint (resumable); under frenzy-completion because it started seconds
    before the short one arrived."""
    s = make_stack({"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 1, "name_prefix": "l4"}]},
                   **({"policy": policy} if policy else {}))
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    long_id = s.submit(sleeper, **ONE_GPU_MODEL, train_steps=10_000_000, resumable=resumable)
    s.wait_state(long_id, (types_pb2.JOB_STATE_RUNNING,), timeout=30)
    assert s.job(long_id).spec.resumable == resumable
    first_pid = dict(s.job(long_id).pids)["l4-0"]
    short_id = s.submit([sys.executable, "-c", "print('short job done')"], **ONE_GPU_MODEL, train_steps=100)
    short = s.wait_state(short_id, DONE, timeout=60)
    assert short.state == types_pb2.JOB_STATE_SUCCEEDED, short
    again = s.wait_state(long_id, (types_pb2.JOB_STATE_RUNNING,), timeout=60)
    assert again.attempt == 2
    text = history.format(short=short_id)
    assert any(text in (h.reason or "") for h in again.history), again.history
    assert not launcher.group_exists(first_pid)  # the first attempt's process was stopped
    s.stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=long_id, reason="e2e done"), timeout=5)
    assert s.wait_state(long_id, DONE, timeout=20).state == types_pb2.JOB_STATE_CANCELLED
    wait_for(lambda: s.held_gpus() == [], 10, "every GPU released")
