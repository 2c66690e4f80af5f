"""Faults across real hosts, under load (issue 37): every service in a network namespace of its own
(``netstack``), a stream of jobs running (each appends a ``start`` and an ``end`` line to a file all
nodes share, so every run of a job is counted), and a fault the network makes — a node's cable
pulled, a lossy and slow link, the leader cut off from Redis, the API killed mid-submission.

What is judged: what the jobs wrote (runs), the jobs' states in Redis, and what Redis executed
(``RedisMonitor``: each script run, when, from which host, what it wrote). Each test prints a
``measured:`` line with its numbers (docs/failures.md, "Faults across hosts", keeps them)."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from faults.netstack import (
    SPEC,
    JobStream,
    NetStack,
    RedisMonitor,
    RunLog,
    Timing,
    job_command,
    net,  # noqa: F401 -- fixtures, by name
    netstack,  # noqa: F401
    settle,
)

from frenzy.v1 import scheduler_pb2
from support.processes import alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def measured(test: str, **numbers: object) -> None:
    """Print the test's numbers (``pytest -s`` or ``-rA`` shows them); with FRENZY_FAULTS_MEASURED set,
    also append them to that file as one JSON line (how docs/failures.md's numbers were collected)."""
    line = json.dumps({"test": test, **numbers}, sort_keys=True)
    print(f"measured: {line}", flush=True)
    if path := os.environ.get("FRENZY_FAULTS_MEASURED"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def ended_once(runs: RunLog, job_ids: list[str]) -> dict[str, int]:
    """job id -> how many of its copies ran to their end (1 for every job that ran once)."""
    ends = Counter(r.job_id for r in runs.runs() if r.kind == "end")
    return {j: ends.get(j, 0) for j in job_ids}


# ---- (1) a node cut off from Redis longer than the dead-after timeout, then back ---------------


def test_a_node_cut_off_past_its_timeout_has_its_job_rerun_once_and_its_copy_stopped(
        netstack, tmp_path: Path) -> None:  # noqa: F811
    t = Timing(heartbeat_s=0.25, ttl_s=1.0, node_dead_after_s=2.0)
    stack: NetStack = netstack(timing=t)
    runs = RunLog(tmp_path / "runs.txt")
    with JobStream(stack, runs.path, sleep_s=10.0, interval_s=2.5) as stream:
        # A node whose job has just started (10 s to go; one GPU a node: its only job) is cut off
        # until a second after the job runs elsewhere.
        def fresh_start():
            now = time.time()
            starts = [r for r in runs.runs() if r.kind == "start"]
            fresh = [r for r in starts if r.attempt == 1 and now - r.at < 0.6]
            return len(starts) >= 3 and fresh and fresh[-1]

        victim = stack.wait(fresh_start, 40, "a job to start on a warm cluster")
        node = stack.host(victim.node)
        node.cut()
        cut_at = time.time()
        try:
            # The agent fences itself (frenzy.agent.fencing): its copy is gone before the scheduler's
            # deadline, so before the job can start elsewhere.
            stopped_at = stack.wait(lambda: not alive(victim.pid) and time.time(), 30,
                                    f"the cut-off copy of {victim.job_id} to be stopped by its own agent")
            rerun = stack.wait(lambda: next((r for r in runs.of(victim.job_id, "start") if r.attempt == 2), None),
                               30, f"{victim.job_id} to run again elsewhere")
            assert rerun.node != victim.node
            assert victim.node in stack.dead_marks(), "the node was declared dead"
            assert stopped_at <= rerun.at, "both copies ran at once: the cut-off one outlived the scheduler's deadline"
            time.sleep(1.0)
        finally:
            node.heal()
        healed_at = time.time()
        back = stack.wait(lambda: victim.node in stack.alive_nodes(), 30, "the node to heartbeat again")
        time.sleep(2.0)  # the stream runs on across the return
    assert back
    states = settle(stack, stream.job_ids, 90)
    measured("agent_partition", rerun_after_cut_s=round(rerun.at - cut_at, 2),
             copy_stopped_after_cut_s=round(stopped_at - cut_at, 2), two_copies_ran_s=0.0,
             partition_s=round(healed_at - cut_at, 2), jobs=len(stream.job_ids),
             submit_errors=sum(1 for s in stream.submitted if s.error))
    assert states[victim.job_id] == ("SUCCEEDED", 2)
    assert [(r.attempt, r.node) for r in runs.of(victim.job_id, "start")] == [(1, victim.node), (2, rerun.node)]
    assert [(r.attempt, r.node) for r in runs.of(victim.job_id, "end")] == [(2, rerun.node)], \
        "the job ended once, in its second attempt; the cut-off copy was stopped before its end"
    assert all(s == "SUCCEEDED" for s, _ in states.values()), states
    assert set(ended_once(runs, stream.job_ids).values()) == {1}, "every job ran to its end exactly once"
    assert stack.gpu_owners() == {}, "no GPU held once every job ended"


# ---- (2) a lossy, slow link ---------------------------------------------------------------------


def test_a_lossy_slow_link_kills_no_live_node_and_runs_no_job_twice(netstack, tmp_path: Path) -> None:  # noqa: F811
    t = Timing(heartbeat_s=0.5, ttl_s=3.0, node_dead_after_s=6.0, cancel_grace_s=2.0)
    stack: NetStack = netstack(timing=t, lossy=("node1",))
    runs = RunLog(tmp_path / "runs.txt")
    lossy = stack.host("node1")
    with RedisMonitor(stack.admin_url) as monitor, JobStream(stack, runs.path, sleep_s=3.0, interval_s=0.8) as stream:
        stack.wait(lambda: len(runs.of_kind("start")) >= 4, 30, "the cluster to be busy")
        lossy.impair(0.3, 0.5)
        impaired_at = time.time()
        time.sleep(30)
        lossy.heal()
        healed_at = time.time()
        time.sleep(3)
    passed, dropped = lossy.lossy.stats()  # type: ignore[union-attr]
    states = settle(stack, stream.job_ids, 90)

    heartbeats = [r.at for r in monitor.script_runs("heartbeat") if r.ip == lossy.ip and r.calls]
    window = [h for h in heartbeats if impaired_at - 5 <= h <= healed_at + 30]
    gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
    declared = [(r.at, r.keys[0]) for r in monitor.script_runs("declare_node_dead") if r.writes]
    early = []
    for at, node_key in declared:
        ip = stack.host(node_key.rsplit(":", 1)[-1]).ip
        last = max((r.at for r in monitor.script_runs("heartbeat") if r.ip == ip and r.calls and r.at < at),
                   default=0.0)
        # The reaper's rule (frenzy.scheduler.reaping): lease gone and silent for dead_after_s,
        # counted on Redis' clock from the last heartbeat Redis ran.
        if at - last < t.node_dead_after_s - 0.05:
            early.append((node_key, round(at - last, 2)))
    ends = ended_once(runs, stream.job_ids)
    measured("lossy_link", loss=0.3, delay_s=0.5, impaired_s=round(healed_at - impaired_at, 1),
             frames_passed=passed, frames_dropped=dropped, heartbeats_seen=len(window),
             max_heartbeat_gap_s=round(max(gaps, default=0.0), 2), declared_dead=len(declared),
             dead_after_s=t.node_dead_after_s, lease_ttl_s=t.ttl_s, jobs=len(stream.job_ids),
             silence_before_declared_s=[round(at - max((r.at for r in monitor.script_runs("heartbeat")
                                                         if r.ip == lossy.ip and r.calls and r.at < at), default=0), 2)
                                        for at, _ in declared],
             reruns=sum(1 for _, a in states.values() if a > 1))
    assert not early, f"declared dead before its heartbeat had been missing for the timeout: {early}"
    assert all(s == "SUCCEEDED" for s, _ in states.values()), states
    twice = {j: n for j, n in ends.items() if n != 1}
    # Two copies at once never: the agent fences itself (frenzy.agent.fencing), so a copy on node1
    # is gone before its rerun starts. What a lossy link can still do is lose the report of a copy
    # that had already ended: the node is declared dead, the job runs again, and the late success
    # is kept (at-least-once completion, docs/failures.md) -- a job that ran to its end twice, its
    # first end before its rerun's start.
    overlapping, report_lost = [], []
    for job_id in stream.job_ids:
        reruns = [r.at for r in runs.of(job_id, "start") if r.attempt >= 2]
        if not reruns:
            continue
        first_ends = [r.at for r in runs.of(job_id, "end") if r.attempt == 1]
        if any(at > min(reruns) for at in first_ends):
            overlapping.append(job_id)
        elif first_ends:
            report_lost.append(job_id)
    measured("lossy_link_runs", reruns=sum(1 for _, a in states.values() if a > 1), overlapping=len(overlapping),
             ended_before_rerun=len(report_lost))
    assert not overlapping, f"a copy still ran when its rerun started (no self-fencing?): {overlapping}"
    assert all(n == 2 and j in report_lost for j, n in twice.items()), \
        f"jobs that ran to their end other than once, not explained by a lost report: {twice}"
    assert stack.gpu_owners() == {}


# ---- (4) the leader cut off from Redis while it keeps running -----------------------------------


def test_the_leader_cut_off_from_redis_is_replaced_within_its_lease_and_fenced(
        netstack, tmp_path: Path) -> None:  # noqa: F811
    t = Timing(heartbeat_s=0.25, ttl_s=1.0, node_dead_after_s=4.0, leader_ttl_s=1.5)
    stack: NetStack = netstack(timing=t)
    runs = RunLog(tmp_path / "runs.txt")
    a, b, redis_host = stack.host("sched-a"), stack.host("sched-b"), stack.redis_host
    assert stack.leader_host() == "sched-a"
    # Submissions go through the standby's API (the leader's cannot reach Redis once cut off).
    with RedisMonitor(stack.admin_url) as monitor, \
            JobStream(stack, runs.path, sleep_s=2.0, interval_s=0.4, target=lambda: "sched-b") as stream:
        stack.wait(lambda: len(runs.of_kind("start")) >= 6, 40, "placements under way")
        a.block(redis_host)
        cut_at = time.time()
        stack.wait(lambda: stack.leader_host() == "sched-b", 15, "the standby to lead")
        new_leader_at = time.time()
        time.sleep(5)  # the standby places while the old leader is cut off
        a.unblock(redis_host)
        healed_at = time.time()
        # The old leader's connections come back (TCP retransmits): wait until Redis hears from it.
        stack.wait(lambda: any(c.ip == a.ip and c.at > healed_at for c in list(monitor.commands)), 40,
                   "the old leader to reach Redis again")
        time.sleep(3)
    states = settle(stack, stream.job_ids, 90)
    time.sleep(0.5)

    renewals = [r.at for r in monitor.script_runs() if r.ip == a.ip and r.writes
                and r.script in ("acquire_lease", "renew_lease")]
    lease_end = max(renewals) + t.leader_ttl_s
    took_over = min(r.at for r in monitor.script_runs("acquire_lease") if r.ip == b.ip and r.writes)
    late = [r for r in monitor.script_runs() if r.ip == a.ip and r.at > lease_end
            and r.script in ("place_jobs", "declare_node_dead")]
    late_writes = [(r.script, r.writes) for r in late if r.writes]
    placed_by = Counter()
    for r in monitor.script_runs("place_jobs"):
        for call in r.writes:
            if call[0].upper() == "HSET" and ":gpu:" in call[1] and "owner" in call[2::2]:
                placed_by[call[call.index("owner") + 1]] += 1
    b_placed = sum(1 for r in runs.of_kind("start") if r.at > new_leader_at)
    measured("leader_partition", new_leader_after_cut_s=round(new_leader_at - cut_at, 2),
             takeover_after_lease_end_s=round(took_over - lease_end, 2),
             old_leader_fenced_calls=len(late), old_leader_back_after_heal_s=round(
                 min(c.at for c in monitor.commands if c.ip == a.ip and c.at > healed_at) - healed_at, 2),
             placed_by_new_leader_during_cut=b_placed, jobs=len(stream.job_ids))
    assert new_leader_at - cut_at <= t.leader_ttl_s + 1.5, "the standby leads within the lease (and a poll)"
    assert took_over >= lease_end - 0.05, "nobody took the lease while the old leader still held it"
    assert not late_writes, f"the old leader changed state after its lease: {late_writes}"
    assert b_placed > 0, "the new leader placed jobs while the old one was cut off"
    assert all(n == 1 for n in placed_by.values()), {j: n for j, n in placed_by.items() if n != 1}
    assert all(st == ("SUCCEEDED", 1) for st in states.values()), states
    assert set(ended_once(runs, stream.job_ids).values()) == {1}
    assert all(len(runs.of(j, "start")) == 1 for j in stream.job_ids), "no job started twice"
    assert stack.gpu_owners() == {}


# ---- (5) the API killed mid-submission -----------------------------------------------------------


def _post(url: str, token: str, body: dict, timeout: float = 20) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def test_the_api_killed_mid_submission_then_a_retry_makes_one_job(netstack, tmp_path: Path) -> None:  # noqa: F811
    stack: NetStack = netstack(with_api=True, lossy=("api",))
    runs = RunLog(tmp_path / "runs.txt")
    api = stack.host("api")
    api.impair(0.0, 0.3)  # a slow link: the scheduler's answer is on its way back when the API dies
    rounds = []
    with JobStream(stack, runs.path, sleep_s=2.0, interval_s=1.0) as stream:
        for k in range(3):
            key = f"api-retry-{k}"
            body = {"name": key, **SPEC, "idempotency_key": key, "command": job_command(runs.path, 1.0)}
            outcome: dict[str, object] = {}

            def submit(body=body, outcome=outcome) -> None:
                try:
                    outcome["reply"] = _post(stack.api_url() + "/api/jobs", stack.token, body)
                except (urllib.error.URLError, ConnectionError, OSError) as exc:
                    outcome["error"] = repr(exc)

            client = threading.Thread(target=submit)
            started = time.time()
            client.start()
            idem = stack.keys.idempotency(f"faults/{key}")
            with stack.admin() as admin:
                job_id = stack.wait(lambda idem=idem: admin.get(idem), 20, f"{key} written in Redis", interval=0.01)
            stack.kill("api")
            killed_at = time.time()
            client.join(timeout=30)
            assert "error" in outcome, f"the API answered before it was killed: {outcome}"
            stack.start_api()
            back_at = time.time()
            retry = _post(stack.api_url() + "/api/jobs", stack.token, body)
            assert retry["duplicate"] is True and retry["id"] == job_id, retry
            rounds.append({"kill_after_submit_s": round(killed_at - started, 2),
                           "api_back_after_kill_s": round(back_at - killed_at, 2), "job": job_id})
    ids = stream.job_ids + [r["job"] for r in rounds]
    states = settle(stack, ids, 90)
    raw, stub = stack.stub("sched-a")
    with raw:
        for k in range(3):
            found = stub.ListJobs(scheduler_pb2.ListJobsRequest(name=f"api-retry-{k}", limit=10), timeout=10).jobs
            assert len(found) == 1, f"api-retry-{k}: {len(found)} jobs"
    measured("api_killed", rounds=rounds, jobs=len(ids))
    assert all(st == ("SUCCEEDED", 1) for st in states.values()), states
    assert set(ended_once(runs, ids).values()) == {1}
    assert all(len(runs.of(j, "start")) == 1 for j in ids)
