"""A job as Redis stores it, decoded: ``JobRecord`` and its one codec (``decode_job``), the attempt
record (``lib/attempt_record.lua``'s JSON: ``attempt_base``, ``attempt_to_proto``, ``exit_note``) and
the history entry. Pure: no Redis here, so the scheduler's pure deciders (reaping.py,
agent_events.py) read jobs without importing the store. ``frenzy.state.store`` reads the hashes
and calls these.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, TypeVar

from frenzy.state.attempts import attempt_limit
from frenzy.state.job_states import ACTIVE, JobState
from frenzy.state.keys import Keys
from frenzy.state.stored_json import message_from_dict
from frenzy.v1 import types_pb2


def history_entry(state: JobState, reason: str = "", at: float | None = None) -> str:
    return json.dumps({"state": state.value, "at": at if at is not None else time.time(), "reason": reason})


T = TypeVar("T")


@dataclass(frozen=True)
class Stored(Generic[T]):
    """A value as the job hash stores it (JSON), parsed by ``parse`` when first read."""

    text: str
    parse: Callable[[str], T]


class _ParsedOnRead(Generic[T]):
    """A ``JobRecord`` field that takes its value or a ``Stored`` one, parsed on first read.

    The scheduler reads whole jobs where it needs a few fields: an agent's event wants the state,
    attempt, fence and placement, the reaper the state; but the job's ~40 ranked plans cost
    ``json_format`` about 3 ms of pure Python to parse (issue 15: most of the placement loop's CPU
    per job). Left as text until someone reads them, they cost nothing there. A dataclass field
    whose default is a descriptor sets and gets through it; raising AttributeError on the class
    keeps the field required (no default).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> T:
        if obj is None:
            raise AttributeError(self.name)
        value = obj.__dict__[self.name]
        if isinstance(value, Stored):
            # Two threads may both parse it: the same value either way.
            value = obj.__dict__[self.name] = value.parse(value.text)
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: T | Stored[T]) -> None:
        obj.__dict__[self.name] = value


def _spec_from_json(text: str) -> types_pb2.JobSpec:
    return message_from_dict(json.loads(text), types_pb2.JobSpec)


def _plans_from_json(text: str) -> list[types_pb2.Plan]:
    return [message_from_dict(p, types_pb2.Plan) for p in json.loads(text)]


def _plan_from_json(text: str) -> types_pb2.Plan | None:
    return message_from_dict(json.loads(text), types_pb2.Plan) if text else None


@dataclass(frozen=True)
class JobRecord:
    """One job as stored in Redis (decoded; the spec and plans when first read)."""

    id: str
    state: JobState
    seq: int
    submitted_at: float
    attempt: int
    model_name: str
    parameter_count: int
    placement: list[tuple[str, list[int]]]
    fence: int
    pending_reason: str
    cancel_requested: bool
    exit_codes: dict[str, int]
    log_paths: dict[str, str]
    # Required, though placed among the defaults (a descriptor-typed field reads as having one to
    # a type checker, and no field without a default may follow it).
    spec: _ParsedOnRead[types_pb2.JobSpec] = _ParsedOnRead()
    plans: _ParsedOnRead[list[types_pb2.Plan]] = _ParsedOnRead()
    plan: _ParsedOnRead[types_pb2.Plan | None] = _ParsedOnRead()
    history: list[dict[str, Any]] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    master_node: str = ""
    master_addr: str = ""
    master_port: int = 0
    failed_node: str = ""
    failed_rank: int = -1
    failed_exit_code: int = 0
    max_attempts: int = 0  # 0: the scheduler's default
    stop_requested: bool = False
    preemptions: int = 0  # times HAS stopped it for a shorter job (not counted against attempts)
    reserved_at: float = 0.0  # when its current (or last) reservation was made
    user: str = ""  # who submitted it ("" for jobs from before tokens)
    # The attempt the last requeue ended (0: none), its fence and nodes: a late exit 0 of it
    # can still finish the job (finish_from_earlier_attempt.lua).
    previous_attempt: int = 0
    previous_fence: int = 0
    previous_nodes: tuple[str, ...] = ()
    # Each attempt's record (lib/attempt_record.lua: plan, exit, cause, last lines, observed peak),
    # oldest first; and the out-of-memory threshold (has.oom) once an attempt ran out of memory.
    attempts: tuple[dict[str, Any], ...] = ()
    oom_threshold: float | None = None
    # A resumable job stopped for shorter ones (JobSpec.resumable): the share of its work done by
    # then, as the scheduler estimates it (time run / the plan's runtime); its plans' runtimes are
    # scaled by what is left when it queues again.
    done_fraction: float = 0.0

    @property
    def oom_exits(self) -> int:
        """Attempts that ended because a GPU ran out of memory."""
        return sum(1 for a in self.attempts if a.get("cause") == "oom")

    def to_proto(self) -> types_pb2.Job:
        job = types_pb2.Job(
            id=self.id, spec=self.spec, state=self.state.to_proto(), pending_reason=self.pending_reason,
            attempt=self.attempt, submitted_at=self.submitted_at, candidate_plans=self.plans,
            model_name=self.model_name, parameter_count=self.parameter_count,
        )
        if self.plan is not None:
            job.plan.CopyFrom(self.plan)
        for node, gpus in self.placement:
            job.placement.add(node=node, gpu_indices=gpus)
        for h in self.history:
            job.history.add(state=JobState(h["state"]).to_proto(), at=float(h["at"]), reason=h.get("reason", ""))
        job.exit_codes.update(self.exit_codes)
        job.log_paths.update(self.log_paths)
        job.pids.update(self.pids)
        job.master_addr, job.master_port = self.master_addr, self.master_port
        job.failed_node = self.failed_node
        if self.failed_node and self.failed_rank >= 0:
            job.failed_node_rank, job.failed_exit_code = self.failed_rank, self.failed_exit_code
        # The limit as requeue_job applies it (what `frenzy job` and the history's "attempt N of M"
        # both say); 0 for a job under the scheduler's default, which the record does not know.
        job.max_attempts = attempt_limit(self.max_attempts, self.preemptions, self.oom_exits) if self.max_attempts else 0
        job.user = self.user
        recorded = set()
        for rec in self.attempts:
            job.attempts.append(attempt_to_proto(rec))
            recorded.add(int(rec.get("attempt", 0) or 0))
        if self.plan is not None and self.state in ACTIVE and self.attempt not in recorded:
            job.attempts.append(attempt_to_proto({**attempt_base(self.attempt, self.plan), "outcome": "running"}))
        job.oom_threshold = self.oom_threshold or 0.0
        return job

    def node_rank(self, node: str) -> int:
        """torchrun node rank of ``node`` (its position in the placement), -1 when not placed there."""
        for rank, (n, _) in enumerate(self.placement):
            if n == node:
                return rank
        return -1

    def gpu_keys(self, keys: Keys) -> list[str]:
        """Each GPU hash of the placement followed by its node's hash: the scripts that release
        GPUs bump the node's ``rev`` so the scheduler re-reads that node."""
        return [key for node, idxs in self.placement for i in idxs for key in (keys.gpu(node, i), keys.node(node))]


def attempt_base(attempt: int, plan: types_pb2.Plan | None) -> dict[str, Any]:
    """An attempt's record before anything happened: the plan it runs with (lib/attempt_record.lua)."""
    if plan is None:
        return {"attempt": attempt}
    lay = plan.layout
    return {"attempt": attempt, "gpu_type": plan.gpu_type, "num_gpus": plan.num_gpus,
            "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "zero_stage": lay.zero_stage,
                       "micro_batch": lay.micro_batch, "grad_accum": lay.grad_accum, "recompute": lay.recompute,
                       "vpp": lay.vpp},
            "predicted_peak_bytes": int(plan.peak_bytes_per_gpu), "gpu_memory_bytes": int(plan.gpu_memory_bytes)}


def attempt_to_proto(rec: dict[str, Any]) -> types_pb2.Attempt:
    """One stored attempt record as the wire's ``Attempt``."""
    lay = rec.get("layout") or {}
    tail = rec.get("tail") or ""
    return types_pb2.Attempt(
        attempt=int(rec.get("attempt", 0) or 0), gpu_type=str(rec.get("gpu_type", "")),
        num_gpus=int(rec.get("num_gpus", 0) or 0),
        layout=types_pb2.Layout(tp=int(lay.get("tp", 0) or 0), pp=int(lay.get("pp", 0) or 0),
                                dp=int(lay.get("dp", 0) or 0), zero_stage=int(lay.get("zero_stage", 0) or 0),
                                micro_batch=int(lay.get("micro_batch", 0) or 0),
                                grad_accum=int(lay.get("grad_accum", 0) or 0), recompute=str(lay.get("recompute", "")),
                                vpp=int(lay.get("vpp", 0) or 0)),
        predicted_peak_bytes=int(rec.get("predicted_peak_bytes", 0) or 0),
        gpu_memory_bytes=int(rec.get("gpu_memory_bytes", 0) or 0),
        observed_peak_bytes=int(rec.get("observed_peak_bytes", 0) or 0), exit_code=int(rec.get("exit_code", 0) or 0),
        cause=str(rec.get("cause", "")), node=str(rec.get("node", "")),
        tail=tail.split("\n") if isinstance(tail, str) and tail else [],
        outcome=str(rec.get("outcome", "")), ended_at=float(rec.get("ended_at", 0) or 0),
    )


def exit_note(job: JobRecord, node: str, code: int, cause: str = "", tail: Iterable[str] = (), peak: int = 0,
              measured: bool = False) -> str:
    """The attempt note (lib/attempt_record.lua) for one node's exit report of ``job``'s attempt."""
    return json.dumps({"base": attempt_base(job.attempt, job.plan),
                       "exit": {"node": node, "code": code, "cause": cause, "tail": "\n".join(tail), "peak": peak,
                                "measured": measured}})


def fraction(raw: str | None) -> float:
    """A stored share of work done in [0, 1) (0 when absent or not a number)."""
    try:
        value = float(raw or 0.0)
    except ValueError:
        return 0.0
    return value if 0.0 <= value < 1.0 else 0.0


def decode_job(raw: dict[str, str], hist: list[str]) -> JobRecord:
    """A job as its hash (``HGETALL``) and history list (``LRANGE``) store it: the one codec of a job."""
    spec = Stored(raw.get("spec", "{}"), _spec_from_json)
    plans = Stored(raw.get("plans", "[]"), _plans_from_json)
    plan = Stored(raw.get("plan", ""), _plan_from_json)
    placement = [(n, list(g)) for n, g in json.loads(raw["placement"])] if raw.get("placement") else []
    exits = {k.removeprefix("exit:"): int(v) for k, v in raw.items() if k.startswith("exit:")}
    logs = {k.removeprefix("log:"): v for k, v in raw.items() if k.startswith("log:")}
    pids = {k.removeprefix("pid:"): int(v) for k, v in raw.items() if k.startswith("pid:")}
    attempts = []
    for k, v in raw.items():
        if k.startswith("attempt:"):
            try:
                rec = json.loads(v)
            except ValueError:
                continue  # not what lib/attempt_record wrote: left out, the job still reads
            if isinstance(rec, dict):
                attempts.append(rec)
    attempts.sort(key=lambda rec: int(rec.get("attempt", 0) or 0))
    return JobRecord(
        id=raw["id"], state=JobState(raw["state"]), seq=int(raw.get("seq", 0)),
        submitted_at=float(raw.get("submitted_at", 0)), attempt=int(raw.get("attempt", 1)), spec=spec,
        plans=plans, model_name=raw.get("model_name", ""), parameter_count=int(raw.get("parameter_count", 0)),
        plan=plan, placement=placement, fence=int(raw.get("fence", 0) or 0), user=raw.get("user", ""),
        pending_reason=raw.get("pending_reason", ""), cancel_requested=raw.get("cancel_requested") == "1",
        exit_codes=exits, log_paths=logs, history=[json.loads(h) for h in hist], pids=pids,
        master_node=raw.get("master_node", ""), master_addr=raw.get("master_addr", ""),
        master_port=int(raw.get("master_port", 0) or 0), failed_node=raw.get("failed_node", ""),
        failed_rank=int(raw["failed_rank"]) if raw.get("failed_rank", "") != "" else -1,
        failed_exit_code=int(raw.get("failed_exit_code", 0) or 0),
        max_attempts=int(raw.get("max_attempts", 0) or 0), stop_requested=raw.get("stop_requested") == "1",
        preemptions=int(raw.get("preemptions", 0) or 0), reserved_at=float(raw.get("reserved_at", 0) or 0),
        previous_attempt=int(raw.get("prev_attempt", 0) or 0), previous_fence=int(raw.get("prev_fence", 0) or 0),
        previous_nodes=tuple(n for n in raw.get("prev_nodes", "").split(",") if n),
        attempts=tuple(attempts),
        oom_threshold=float(raw["oom_threshold"]) if raw.get("oom_threshold") else None,
        done_fraction=fraction(raw.get("done_fraction")),
    )


def _int(raw: str | None, default: int = 0) -> int:
    """A stored integer; ``default`` when absent or unreadable (a hash written around the scripts)."""
    try:
        return int(raw) if raw not in (None, "") else default
    except ValueError:
        return default


@dataclass(frozen=True)
class GpuRecord:
    """One GPU hash (``gpu:{node}:{i}``) as the agent registers and beats it and the scripts own it."""

    index: int  # -1: the hash has none (not written by register_node)
    gpu_type: str = ""
    uuid: str = ""
    nvml_name: str = ""
    memory_total: int = 0
    memory_free: int = 0
    healthy: bool = True
    owner: str = ""  # the job holding it ("" when free)
    fence: str | None = None  # the reservation that took it, as written (compared as text)
    pci_bus_id: str = ""
    utilization: int = -1  # percent; -1 unknown
    health_reason: str = ""
    type_from_memory: bool = False
    processes: str = "[]"  # JSON as the agent wrote it ([pid, used bytes] pairs): parsed by who shows it
    links: str = "{}"  # JSON: peer index -> link


def decode_gpu(raw: Mapping[str, str]) -> GpuRecord:
    """A GPU hash, decoded: the one codec of a GPU (the cluster read keeps its own rows for speed)."""
    return GpuRecord(
        index=_int(raw.get("index"), -1), gpu_type=raw.get("type", ""), uuid=raw.get("uuid", ""),
        nvml_name=raw.get("nvml_name", ""), memory_total=_int(raw.get("memory_total")),
        memory_free=_int(raw.get("memory_free")), healthy=raw.get("healthy", "1") == "1",
        owner=raw.get("owner") or "", fence=raw.get("fence"), pci_bus_id=raw.get("pci_bus_id", ""),
        utilization=_int(raw.get("utilization"), -1), health_reason=raw.get("health_reason", ""),
        type_from_memory=raw.get("type_from_memory") == "1", processes=raw.get("processes") or "[]",
        links=raw.get("links") or "{}",
    )


# The most GPUs the scheduler reads of one node: a node hash's gpu_count is its agent's to write,
# and a count of 10**9 must not make every tick build 10**9 keys (issue 34).
MAX_GPUS_PER_NODE = 256


def gpu_count(raw: object) -> int:
    """A node hash's ``gpu_count`` as the scheduler reads it: 0 unless a whole number in
    0..MAX_GPUS_PER_NODE (what an agent wrote past that is not read)."""
    text = str(raw or "0")
    if not text.isdigit() or len(text) > 4:
        return 0
    return min(int(text), MAX_GPUS_PER_NODE)


@lru_cache(maxsize=1024)
def gpu_type_problem(gpu_type: str) -> str:
    """Why the scheduler does not schedule a GPU of ``gpu_type`` ("" when it does: no type, which
    is never in a pool, or a catalog name as the catalog writes it). An agent writes its GPUs'
    types; one the predictor does not know made every submission of every user fail (issue 34),
    so such a GPU is left out of the pools and of placement, and shown with this reason."""
    if not gpu_type:
        return ""
    from marp.gpus import find_gpu  # (marp loads numpy: not for every importer of records)

    known = find_gpu(gpu_type)
    shown = gpu_type[:64]
    if known is None:
        return f"unknown GPU type {shown!r} (not in the catalog): not scheduled"
    if known.name != gpu_type:
        return f"GPU type {shown!r} is not written as the catalog's {known.name!r}: not scheduled"
    return ""


def scheduled_gpu(index: object, gpu_type: object, total: object, free: object,
                  healthy: object) -> tuple[int, str, int, int, bool] | None:
    """One GPU row of the cluster read as HAS gets it: (index, type, memory total, free, healthy),
    or None for a row without a whole-number index. A type the catalog does not know, or memory
    that is not a whole number, makes the GPU unhealthy and typeless (never in a pool, never
    placed on) instead of failing the read of the whole cluster."""
    idx = str(index or "")
    if not idx.isdigit() or len(idx) > 4:
        return None
    kind = str(gpu_type or "")
    mem_total, mem_free = str(total or "0"), str(free or "0")
    good = not gpu_type_problem(kind) and mem_total.isdigit() and mem_free.isdigit()
    if not good:
        return int(idx), "", 0, 0, False
    return int(idx), kind, int(mem_total), int(mem_free), (healthy or "1") == "1"


@dataclass(frozen=True)
class NodeRecord:
    """One registered node: its hash (``node:{n}``), whether its heartbeat lease exists, its GPUs."""

    name: str  # "" for a registered name without a node hash (being removed)
    alive: bool
    addr: str = ""
    draining: bool = False
    heartbeat_at: str = ""  # Redis time as written ("" if never): the reaper fences on this exact text
    dead_at: str = ""  # set once the scheduler declared it dead
    health_reason: str = ""
    refused_launches: int | None = None  # as its agent counts them (None: never written)
    gpus: tuple[GpuRecord, ...] = ()


def decode_node(raw: Mapping[str, str], alive: bool, gpus: Iterable[Mapping[str, str]]) -> NodeRecord:
    """A node hash, its lease and its GPU hashes, decoded: the one codec of a node."""
    refused = raw.get("refused_launches")
    return NodeRecord(
        name=raw.get("name", ""), alive=alive, addr=raw.get("addr", ""), draining=raw.get("draining") == "1",
        heartbeat_at=raw.get("heartbeat_at", ""), dead_at=raw.get("dead_at", ""),
        health_reason=raw.get("health_reason", ""),
        refused_launches=_int(refused) if refused is not None else None,
        gpus=tuple(decode_gpu(g) for g in gpus),
    )
