"""The batched placement path (``place_jobs.lua`` through ``SchedulerLoop.tick``): a tick's jobs are
reserved and launched in one call, each job all or nothing, and a tick costs the same few round
trips whether it places 5 jobs or 40."""

from __future__ import annotations

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind, LaunchMessage, command_from, payload
from frenzy.state.outcomes import PlaceOutcome
from frenzy.state.store import PlacementOrder, StateStore
from support.state import GiB, add_node, make_plan, make_spec, send_event


class CountingConnection(redis.Connection):
    """A real connection that counts the requests it sends (a pipeline is one)."""

    sent = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def _launches(client: redis.Redis, keys: Keys, node: str) -> list[LaunchMessage]:
    out = []
    for _, fields in client.xrange(keys.launch_stream(node)):
        cmd = command_from(payload(fields))
        if isinstance(cmd, LaunchMessage):
            out.append(cmd)
    return out


def _loop(client: redis.Redis, keys: Keys) -> SchedulerLoop:
    return SchedulerLoop(client, keys, master_ports=(30000, 30100))


def test_a_tick_places_every_job_it_can_in_one_call(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 8)
    loop = _loop(redis_client, keys)
    ids = [loop.store.submit(make_spec(f"j{i}"), [make_plan("A100-80GB", dp=2)], "gpt2-124m", 1)[0] for i in range(4)]
    report = loop.tick()
    assert sorted(report.placed) == sorted(ids) and report.conflicts == []
    jobs = [loop.store.get(j) for j in ids]
    assert all(j.state == JobState.LAUNCHING for j in jobs)
    assert all([h["state"] for h in j.history] == ["PENDING", "RESERVED", "LAUNCHING"] for j in jobs)
    # Four jobs on one master node: four different rendezvous ports, each in the node's table.
    ports = {j.master_port for j in jobs}
    assert len(ports) == 4 and {int(p) for p in redis_client.hkeys(keys.ports("n0"))} == ports
    held = [redis_client.hget(keys.gpu("n0", i), "owner") for i in range(8)]
    assert sorted(held) == sorted(j for j in ids for _ in range(2))
    launches = _launches(redis_client, keys, "n0")
    assert sorted(m.job_id for m in launches) == sorted(ids)
    for m in launches:
        job = next(j for j in jobs if j.id == m.job_id)
        assert (m.fence, m.master_port, m.attempt) == (job.fence, job.master_port, job.attempt)
        assert m.gpu_uuids == [f"GPU-n0-{i}" for i in m.gpu_indices]  # from the cluster read, not a lookup
    assert len({j.fence for j in jobs}) == 4


def test_each_job_is_all_or_nothing_and_later_jobs_see_earlier_ones(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    store = StateStore(redis_client, keys)
    a, _ = store.submit(make_spec("a"), [make_plan("A100-80GB", dp=2)], "gpt2-124m", 1)
    b, _ = store.submit(make_spec("b"), [make_plan("A100-80GB", dp=1)], "gpt2-124m", 1)
    store.queue()
    store.cluster()
    fence_a, fence_b = store.fences.take(2)

    def order(job_id: str, fence: int, gpus: tuple[int, ...], port: int) -> PlacementOrder:
        return PlacementOrder(job_id=job_id, attempt=1, fence=fence, nodes=(("n0", gpus),), need_bytes=GiB,
                              port=port, master_addr="127.0.0.1", gpu_type="A100-80GB", plan_json="{}",
                              messages=("{}",))

    # b wants GPU 1, which a (first in the batch) takes: b is refused and writes nothing.
    results = store.place([order(a, fence_a, (0, 1), 30001), order(b, fence_b, (1,), 30002)])
    assert results[0] == PlaceOutcome(True)
    assert not results[1].placed and "is held by " + a in results[1].why
    assert store.get(b).state == JobState.PENDING and redis_client.hget(keys.ports("n0"), "30002") is None
    assert redis_client.zscore(keys.queue(), b) is not None


def test_a_job_requeued_since_the_queue_read_is_not_launched(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    store = StateStore(redis_client, keys)
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB")], "gpt2-124m", 1)
    store.queue()
    (fence,) = store.fences.take(1)
    redis_client.hset(keys.job(job_id), "attempt", "2")  # requeued (and re-planned) meanwhile
    (result,) = store.place([PlacementOrder(job_id=job_id, attempt=1, fence=fence, nodes=(("n0", (0,)),),
                                            need_bytes=GiB, port=30001, master_addr="127.0.0.1",
                                            gpu_type="A100-80GB", plan_json="{}", messages=("{}",))])
    assert not result.placed and "attempt 2" in result.why
    assert redis_client.hget(keys.gpu("n0", 0), "owner") == "" and redis_client.xlen(keys.launch_stream("n0")) == 0


def test_a_fence_never_handed_out_is_refused(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 1)
    store = StateStore(redis_client, keys)
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB")], "gpt2-124m", 1)
    forged = int(redis_client.get(keys.seq()) or 0) + 1000
    (result,) = store.place([PlacementOrder(job_id=job_id, attempt=1, fence=forged, nodes=(("n0", (0,)),),
                                            need_bytes=GiB, port=30001, master_addr="127.0.0.1",
                                            gpu_type="A100-80GB", plan_json="{}", messages=("{}",))])
    assert not result.placed and "never handed out" in result.why


def test_a_port_taken_behind_the_schedulers_back_is_a_conflict_then_avoided(redis_client: redis.Redis,
                                                                            keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    loop = _loop(redis_client, keys)
    job_id, _ = loop.store.submit(make_spec(), [make_plan("A100-80GB")], "gpt2-124m", 1)
    loop.store.load_ports(["n0"])  # the scheduler's table: empty
    port = loop.store.ports.pick("n0", job_id, loop.master_ports)
    loop.store.ports.forget("n0")
    loop.store.load_ports(["n0"])
    redis_client.hset(keys.ports("n0"), str(port), "someone-else")  # taken after the scheduler read the table
    first = loop.tick()
    assert first.placed == [] and "port taken" in first.conflicts[0]
    second = loop.tick()  # the table is read again: another port
    assert second.placed == [job_id] and loop.store.get(job_id).master_port != port


def test_a_tick_costs_the_same_round_trips_for_5_or_40_jobs(redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    counting = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=CountingConnection,
                                                                **client.get_connection_kwargs()))
    for i in range(10):
        add_node(client, keys, f"n{i}", "A100-80GB", 8)
    loop = _loop(counting, keys)
    trips = []
    # The first tick also loads the scripts, takes a block of fences and reads the nodes' keys.
    for batch in (1, 5, 40):
        for i in range(batch):
            loop.store.submit(make_spec(f"b{batch}-{i}"), [make_plan("A100-80GB")], "gpt2-124m", 1)
        before = CountingConnection.sent
        report = loop.tick()
        trips.append(CountingConnection.sent - before)
        assert len(report.placed) == batch, report.conflicts
    # queue (2), cluster (3), plans of new jobs (1), node keys and port tables of nodes not used
    # before (1 each at most), place (1); not one per job
    assert abs(trips[2] - trips[1]) <= 2 and trips[2] <= 11, trips


def test_events_are_handled_in_batches_in_stream_order_per_job(redis_url: str, keys: Keys) -> None:
    """Each job's RUNNING then EXITED arrive in one batch: both are applied, in order (the EXITED is
    interpreted against the job the RUNNING left), with one acknowledgement for the whole batch
    and round trips that do not grow with the events: each round's scripts go in one pipeline."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    counting = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=CountingConnection,
                                                                **client.get_connection_kwargs()))
    add_node(client, keys, "n0", "A100-80GB", 8)
    loop = _loop(counting, keys)
    ids = [loop.store.submit(make_spec(f"e{i}"), [make_plan("A100-80GB")], "gpt2-124m", 1)[0] for i in range(6)]
    assert sorted(loop.tick().placed) == sorted(ids)
    loop.drain_events(block_ms=10)  # creates the group, reads its (empty) pending list
    jobs = [loop.store.get(j) for j in ids]
    for j in jobs:
        send_event(client, keys, AgentEvent(kind=EventKind.RUNNING, job_id=j.id, attempt=1, node="n0",
                                            fence=j.fence, pid=100, log_path=f"/logs/{j.id}"))
    for j in jobs:
        send_event(client, keys, AgentEvent(kind=EventKind.EXITED, job_id=j.id, attempt=1, node="n0",
                                            fence=j.fence, exit_code=0))
    before = CountingConnection.sent
    assert loop.drain_events(block_ms=10) == 12
    trips = CountingConnection.sent - before
    for j in ids:
        job = loop.store.get(j)
        assert job.state == JobState.SUCCEEDED, job.history
        assert [h["state"] for h in job.history][-2:] == ["RUNNING", "SUCCEEDED"]
        assert job.log_paths == {"n0": f"/logs/{j}"}
    assert client.xpending(keys.events_stream(), "scheduler")["pending"] == 0
    # read (1) + per round a job read (2) + a script per event (12) + the ack (1), and on a fresh
    # Redis the node's key and two script loads; one event at a time took 42 (a read, a script, an
    # HSET for the RUNNING's pid and log, an ack)
    # read (1), per round a job read and one pipeline of its events' scripts (2 x 2), the ack (1);
    # on this fresh Redis also the node's key (1) and, per round, loading its script and sending
    # the calls again (2 x 2). One script round trip per event took 22; one event at a time, 42.
    assert trips <= 11, trips


def test_a_batch_whose_script_fails_for_one_job_handles_the_others_and_keeps_that_one_pending(
        redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    add_node(client, keys, "n0", "A100-80GB", 8)
    loop = _loop(client, keys)
    ids = [loop.store.submit(make_spec(f"f{i}"), [make_plan("A100-80GB")], "gpt2-124m", 1)[0] for i in range(3)]
    assert sorted(loop.tick().placed) == sorted(ids)
    loop.drain_events(block_ms=10)
    jobs = [loop.store.get(j) for j in ids]
    for j in jobs:
        send_event(client, keys, AgentEvent(kind=EventKind.RUNNING, job_id=j.id, attempt=1, node="n0",
                                            fence=j.fence, pid=100, log_path=f"/logs/{j.id}"))
    assert loop.drain_events(block_ms=10) == 3
    # The middle job's GPU hash turned into a string: its exit's script fails (WRONGTYPE) inside
    # the batch's pipeline.
    (node, (gpu,)), = jobs[1].placement
    client.delete(keys.gpu(node, gpu))
    client.set(keys.gpu(node, gpu), "not a hash")
    for j in jobs:
        send_event(client, keys, AgentEvent(kind=EventKind.EXITED, job_id=j.id, attempt=1, node="n0",
                                            fence=j.fence, exit_code=0))
    assert loop.drain_events(block_ms=10) == 3
    assert [loop.store.get(ids[i]).state for i in (0, 2)] == [JobState.SUCCEEDED, JobState.SUCCEEDED]
    assert client.xpending(keys.events_stream(), "scheduler")["pending"] == 1  # retried, never lost
    assert loop.metrics.events.labels("failed")._value.get() == 1


def test_an_idle_tick_reads_the_queue_and_no_node(redis_url: str, keys: Keys) -> None:
    """The node names and heads come with the queue's reads only while jobs wait (the cluster is
    read next); a tick of an empty queue is one round trip, whatever the cluster's size."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    counting = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=CountingConnection,
                                                                **client.get_connection_kwargs()))
    for n in range(20):
        add_node(client, keys, f"n{n}", "A100-80GB", 8)
    loop = _loop(counting, keys)
    loop.tick()  # (a first tick may load scripts)
    before = CountingConnection.sent
    assert loop.tick().placed == []
    assert CountingConnection.sent - before == 1
    job = loop.store.submit(make_spec("woke"), [make_plan("A100-80GB")], "gpt2-124m", 1)[0]
    assert loop.tick().placed == [job]  # and a job that then arrives is placed as before


def test_a_launch_names_its_job_s_submitter(redis_client: redis.Redis, keys: Keys) -> None:
    # An agent with a user map runs a job as its submitter's account (issue 34): the signed launch
    # must say who that is, for every node of the placement, and "" for a job of no named user.
    for node in ("n0", "n1", "n2"):
        add_node(redis_client, keys, node, "A100-80GB", 2)
    loop = _loop(redis_client, keys)
    alices = loop.store.submit(make_spec("a"), [make_plan("A100-80GB", dp=4)], "gpt2-124m", 1, user="alice")[0]
    nobody = loop.store.submit(make_spec("b"), [make_plan("A100-80GB", dp=2)], "gpt2-124m", 1)[0]
    assert sorted(loop.tick().placed) == sorted([alices, nobody])
    by_job: dict[str, list[str]] = {}
    for node in ("n0", "n1", "n2"):
        for m in _launches(redis_client, keys, node):
            by_job.setdefault(m.job_id, []).append(m.user)
    assert by_job[alices] == ["alice", "alice"]  # one launch per node, each naming her
    assert by_job[nobody] == [""]
