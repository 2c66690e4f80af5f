"""StreamLogs and ListNodes over real gRPC on loopback, against a real Redis.

Log chunks are written with the agents' own script (append_log.lua), exactly as an agent ships them:
into each node's own stream of the job, which StreamLogs merges in time order for the nodes the job
was placed on (frenzy.state.job_logs)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import redis

from frenzy.state import scripts
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import LogChunk
from frenzy.state.store import StateStore
from frenzy.v1 import scheduler_pb2
from support.servers import Servers, running_servers
from support.state import add_node, make_plan, make_spec, place_on


@pytest.fixture
def servers(redis_url: str, prefix: str) -> Iterator[Servers]:
    with running_servers(redis_url, prefix) as s:
        yield s


class Shipper:
    """Appends log pieces the way an agent does, tracking each node's offset."""

    def __init__(self, client: redis.Redis, keys: Keys, job_id: str) -> None:
        self.client, self.keys, self.job_id = client, keys, job_id
        self.append = scripts.register(client, "append_log")
        self.offsets: dict[tuple[str, int], int] = {}

    def __call__(self, node: str, text: str, attempt: int = 1, start: int | None = None) -> int:
        # Streams merge by entry id, the millisecond Redis appended it: within one millisecond two
        # nodes' entries have no order, so each piece here lands in a millisecond of its own.
        time.sleep(0.002)
        off = self.offsets.get((node, attempt), 0) if start is None else start
        end = off + len(text.encode())
        chunk = LogChunk(node=node, attempt=attempt, offset=off, text=text)
        shipped = int(self.append(keys=[self.keys.job_logs(self.job_id, node),
                                        self.keys.job_log_offsets(self.job_id, node)],
                                  args=[f"{node}/{attempt}", off, end, 1000, chunk.model_dump_json(), 60_000]))
        self.offsets[(node, attempt)] = shipped
        return shipped


def _job(store: StateStore, *nodes: str) -> str:
    """A job, placed on ``nodes`` (default a and b): StreamLogs reads those nodes' streams."""
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    place_on(store.r, store.k, job_id, *(nodes or ("a", "b")))
    return job_id


def _read(servers: Servers, job_id: str, **kw: object) -> list[scheduler_pb2.LogChunk]:
    return list(servers.stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, **kw), timeout=20))


def test_logs_by_node_attempt_and_tail(servers: Servers, redis_client: redis.Redis, keys: Keys,
                                       store: StateStore) -> None:
    job_id = _job(store)
    ship = Shipper(redis_client, keys, job_id)
    ship("a", "a1\na2\n")
    ship("b", "b1\n")
    ship("a", "a3\na4\na5\n")
    ship("a", "again\n", attempt=2)
    redis_client.xadd(keys.job_logs(job_id, "b"), {"data": "{garbage"})  # skipped, never breaks the stream
    everything = _read(servers, job_id)
    assert "".join(c.text for c in everything) == "a1\na2\nb1\na3\na4\na5\nagain\n"
    assert [(c.node, c.attempt, c.offset) for c in everything] == [("a", 1, 0), ("b", 1, 0), ("a", 1, 6),
                                                                    ("a", 2, 0)]
    assert "".join(c.text for c in _read(servers, job_id, node="a", attempt=1)) == "a1\na2\na3\na4\na5\n"
    assert "".join(c.text for c in _read(servers, job_id, attempt=2)) == "again\n"
    tail = _read(servers, job_id, node="a", attempt=1, tail_lines=2)
    assert "".join(c.text for c in tail) == "a4\na5\n" and tail[0].offset == 9  # "a3\n" skipped in the file
    assert "".join(c.text for c in _read(servers, job_id, tail_lines=100)) == "a1\na2\nb1\na3\na4\na5\nagain\n"


def test_a_repeated_or_overlapping_piece_is_not_shipped_twice(redis_client: redis.Redis, keys: Keys,
                                                              store: StateStore) -> None:
    job_id = _job(store)
    ship = Shipper(redis_client, keys, job_id)
    assert ship("a", "one\ntwo\n") == 8
    # A restarted agent that lost its place re-reads from 0: told where to continue, nothing appended.
    assert ship("a", "one\n", start=0) == 8
    assert ship("a", "three\n", start=8) == 14
    assert redis_client.xlen(keys.job_logs(job_id, "a")) == 2
    assert 0 < redis_client.pttl(keys.job_logs(job_id, "a")) <= 60_000  # retention
    with pytest.raises(redis.ResponseError, match="bad offsets"):
        scripts.register(redis_client, "append_log")(
            keys=[keys.job_logs(job_id, "a"), keys.job_log_offsets(job_id, "a")], args=["a/1", 20, 10, 1000, "{}", 0])


def test_follow_streams_live_and_ends_with_the_job(servers: Servers, redis_client: redis.Redis, keys: Keys,
                                                   store: StateStore) -> None:
    job_id = _job(store)
    ship = Shipper(redis_client, keys, job_id)
    ship("a", "first\n")
    got: list[str] = []
    done = threading.Event()

    def follow() -> None:
        for chunk in servers.stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, follow=True),
                                             timeout=20):
            got.append(chunk.text)
        done.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while got != ["first\n"] and time.monotonic() < deadline:
        time.sleep(0.02)
    ship("a", "second\n")
    while got != ["first\n", "second\n"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == ["first\n", "second\n"] and not done.is_set()  # live, and still following
    ship("a", "last words\n")
    store.transition(store.get(job_id), JobState.CANCELLED, "test")
    assert done.wait(5), "follow did not end with the job"
    assert got == ["first\n", "second\n", "last words\n"]


def test_logs_of_unknown_job_and_bad_requests(servers: Servers, store: StateStore) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _read(servers, "job-nope")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        _read(servers, _job(store), tail_lines=-1)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tail_lines" in info.value.details()
    assert _read(servers, _job(store)) == []  # a job without output yet


def test_list_nodes_shows_health_utilization_processes_links_and_death(
        servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    redis_client.hset(keys.gpu("a", 0), mapping={
        "pci_bus_id": "00000000:07:00.0", "utilization": "87", "processes": "[[4242, 1073741824], [77, -1]]",
        "links": '{"1": "NV12"}', "owner": "job-x"})
    redis_client.hset(keys.gpu("a", 1), mapping={
        "healthy": "0", "health_reason": "a GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)", "links": "not json",
        "type_from_memory": "1", "nvml_name": "NVIDIA RTX 6000 Ada Generation"})
    add_node(redis_client, keys, "gone", "L4", 1, alive=False)
    redis_client.hset(keys.node("gone"), mapping={"dead_at": "1700000000.5", "health_reason": "NVML down"})
    nodes = servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(include_dead=True), timeout=5).nodes
    a, gone = sorted(nodes, key=lambda n: n.name)
    g0, g1 = a.gpus
    assert (g0.pci_bus_id, g0.utilization_pct, dict(g0.links), g0.owner) == ("00000000:07:00.0", 87, {1: "NV12"},
                                                                             "job-x")
    assert [(p.pid, p.used_memory) for p in g0.processes] == [(4242, 1 << 30), (77, -1)]
    assert not g1.healthy and "NVML_ERROR_GPU_IS_LOST" in g1.health_reason and dict(g1.links) == {}
    assert g1.type_from_memory and g1.utilization_pct == -1
    assert not gone.alive and gone.declared_dead_at == 1700000000.5 and gone.health_reason == "NVML down"
    alive_only = servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes
    assert [n.name for n in alive_only] == ["a"]


def test_the_logs_command_prefixes_nodes_and_reports_trimming(servers: Servers, redis_client: redis.Redis,
                                                              keys: Keys, store: StateStore) -> None:
    import typer
    from typer.testing import CliRunner

    from frenzy.cli import cmd_logs

    app = typer.Typer()
    cmd_logs.register(app)
    app.command("noop")(lambda: None)  # two commands: typer then expects the command name
    job_id = _job(store)
    redis_client.hset(keys.job(job_id), "placement", '[["a", [0]], ["b", [0]]]')
    ship = Shipper(redis_client, keys, job_id)
    ship("a", "later part\n", start=100)  # the stream lost a's first 100 bytes
    ship("b", "hello\npart")
    ship("b", "ial\nand more")
    ship("a", "a again\n")
    result = CliRunner().invoke(app, ["logs", job_id, "--scheduler", servers.scheduler_addr])
    assert result.exit_code == 0, result.output
    assert "[a] later part\n[b] hello\n[b] partial\n[b] and more\n[a] a again\n" in result.output
    assert "the first 100 bytes were dropped from the log stream" in result.output
    only_b = CliRunner().invoke(app, ["logs", job_id, "--node", "b", "--no-prefix", "--tail", "1",
                                      "--scheduler", servers.scheduler_addr])
    assert only_b.output == "and more\n"
    missing = CliRunner().invoke(app, ["logs", "job-nope", "--scheduler", servers.scheduler_addr])
    assert missing.exit_code == 4 and "NOT_FOUND" in missing.output


def test_nodes_streams_merge_in_time_order_with_the_tail_and_the_caps_per_node(
        servers: Servers, redis_client: redis.Redis, keys: Keys, store: StateStore) -> None:
    """Each node's output is its own stream (issue 34); StreamLogs merges them by entry id, the
    tail counts lines over the merge, and the caps it announces are a node's stream's."""
    job_id = _job(store, "a", "b", "c")
    append = scripts.register(redis_client, "append_log")
    offsets: dict[str, int] = {}
    lines = []
    for i in range(30):
        node = "abc"[i % 3]
        text = f"{node} line {i}\n"
        start = offsets.get(node, 0)
        chunk = LogChunk(node=node, attempt=1, offset=start, text=text).model_dump_json()
        time.sleep(0.002)
        append(keys=[keys.job_logs(job_id, node), keys.job_log_offsets(job_id, node)],
               args=[f"{node}/1", start, start + len(text), 1000, chunk, 60_000, 1 << 20, 2 << 20])
        offsets[node] = start + len(text)
        lines.append(text)
    assert "".join(c.text for c in _read(servers, job_id)) == "".join(lines)
    assert "".join(c.text for c in _read(servers, job_id, tail_lines=4)) == "".join(lines[-4:])
    assert "".join(c.text for c in _read(servers, job_id, node="b")) == "".join(lines[1::3])
    call = servers.stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id), timeout=20)
    list(call)
    meta = dict(call.initial_metadata())
    assert (meta["frenzy-log-cap-bytes"], meta["frenzy-log-file-cap-bytes"]) == (str(1 << 20), str(2 << 20))


def test_follow_picks_up_the_nodes_of_a_later_attempt_and_the_old_stream(
        servers: Servers, redis_client: redis.Redis, keys: Keys, store: StateStore) -> None:
    """A follower reads the nodes a requeue placed the job on (their streams appear as it goes),
    and the one stream of every node that jobs had before issue 34, while it lasts."""
    job_id = _job(store, "a")
    redis_client.xadd(keys.legacy_job_logs(job_id), {"data": LogChunk(
        node="old", attempt=1, offset=0, text="from before\n").model_dump_json()})
    ship = Shipper(redis_client, keys, job_id)
    ship("a", "attempt one\n")
    got: list[tuple[str, str]] = []
    done = threading.Event()

    def follow() -> None:
        for chunk in servers.stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, follow=True),
                                             timeout=30):
            got.append((chunk.node, chunk.text))
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == [("old", "from before\n"), ("a", "attempt one\n")]  # (merged by when Redis took each)
    place_on(redis_client, keys, job_id, "b")  # attempt 2 runs on b alone
    ship("b", "attempt two\n", attempt=2)
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got[-1] == ("b", "attempt two\n")
    ship("a", "late words of a\n")  # (a's agent, still shipping attempt 1's end)
    store.transition(store.get(job_id), JobState.CANCELLED, "test")
    assert done.wait(10), "follow did not end with the job"
    assert got[-1] == ("a", "late words of a\n") and len(got) == 4


def test_a_node_key_that_is_not_a_stream_leaves_the_other_nodes_readable(
        servers: Servers, redis_client: redis.Redis, keys: Keys, store: StateStore) -> None:
    """A node may make its own key a hash (its ACL allows HSET there): one WRONGTYPE must not
    fail the read of every node's output."""
    job_id = _job(store, "a", "b")
    ship = Shipper(redis_client, keys, job_id)
    ship("b", "b's output\n")
    redis_client.hset(keys.job_logs(job_id, "a"), "not", "a stream")
    assert [c.text for c in _read(servers, job_id)] == ["b's output\n"]
    assert [c.text for c in _read(servers, job_id, tail_lines=5)] == ["b's output\n"]


def test_the_nodes_read_come_from_the_real_placement_and_its_history(
        servers: Servers, redis_client: redis.Redis, keys: Keys, store: StateStore) -> None:
    """The scheduler's own reservation names the nodes in the job's history (placed_nodes reads
    it for attempts whose placement a requeue dropped): its format and the reader agree."""
    from frenzy.state.job_logs import placed_nodes

    add_node(redis_client, keys, "gpu-7", "A100-80GB", 1)
    job_id = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("placed")), timeout=30).job.id
    deadline = time.monotonic() + 20
    while store.get(job_id).state == JobState.PENDING and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.05)
    redis_client.hdel(keys.job(job_id), "placement")  # (as a requeue does)
    assert placed_nodes(store.get(job_id)) == ["gpu-7"]  # type: ignore[arg-type]
