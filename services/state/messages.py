"""Messages that cross a Redis stream, as validated pydantic models.

Every stream entry has one field, ``data``, holding the JSON of one of these
models. A reader that gets anything else (a missing field, bad JSON, a wrong
type) raises ``BadMessage`` naming what is wrong; the caller logs it,
acknowledges it so it is not redelivered forever, and carries on. A garbage
entry must never stop a consumer or change state.

Launches, cancels and agent events are sealed (``frenzy.state.signing``): they carry
``nonce``, ``expires_at`` and ``sig``, set by ``sealed`` with the node's key. Readers
check the seal on the entry's raw JSON object (``payload``) before they validate it
into a model (``command_from``, ``event_from``) or act on it.
"""

from __future__ import annotations

import json
import re
import time
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from frenzy.state import signing


class BadMessage(ValueError):
    """A stream entry that is not a valid Frenzy message."""


SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# The same rule for job ids wherever they come in (REST path, gRPC request): every id the
# scheduler makes (job-<12 hex>) matches, nothing that could reach another key or a path does.
SAFE_NAME_RE = re.compile(SAFE_NAME)


def is_safe_name(name: str) -> bool:
    """Whether ``name`` may be a job id or node name: the pattern, and no ``..``."""
    return SAFE_NAME_RE.fullmatch(name) is not None and ".." not in name


def _no_dot_dot(name: str) -> str:
    if ".." in name:
        raise ValueError("must not contain '..'")
    return name


# Job ids and node names become file names on the agents (LOG_DIR/JOB/attempt-N/NODE.log):
# one path component, no separator, no "..". Job ids are job-<12 hex> today.
SafeName = Annotated[str, Field(pattern=SAFE_NAME), AfterValidator(_no_dot_dot)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sealed(_Msg):
    """A control message: signed with a node's key (``sealed``); unsigned ones are refused."""

    nonce: str = ""
    expires_at: int = 0  # unix seconds
    sig: str = ""


class LayoutEnv(_Msg):
    """The plan's parallel layout as the launched job sees it."""

    gpu_type: str
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    zero_stage: int = Field(ge=0, le=3)
    micro_batch: int = Field(ge=1)
    grad_accum: int = Field(ge=1)
    recompute: str = "none"
    # MARP's predicted peak bytes per GPU (0: unknown). Fake GPUs report it as used memory
    # while the job runs there, as a real GPU would show the job's allocations.
    peak_bytes_per_gpu: int = Field(default=0, ge=0)
    # A mixed plan's launch contract for this node's ranks (docs/mixed-plans.md): the five
    # FRENZY_STAGE* / FRENZY_LOCAL_* / FRENZY_LOSS_SCALE variables as ``frenzy.train.contract.render``
    # gives them (one value, or one per local rank). Empty: a single-type plan, no contract.
    contract: dict[str, str] = Field(default_factory=dict)

    @field_validator("contract")
    @classmethod
    def _whole_contract(cls, value: dict[str, str]) -> dict[str, str]:
        from frenzy.train import contract

        if value and set(value) != set(contract.NAMES):
            raise ValueError(f"a launch contract sets all of {', '.join(contract.NAMES)} or none, got {sorted(value)}")
        for rank in range(max((v.count(",") + 1 for v in value.values()), default=0)):  # every local rank's
            contract.parse({**value, contract.LOCAL_RANK: str(rank)})  # well formed (ContractError: a ValueError)
        return value


class LaunchMessage(_Sealed):
    """Scheduler -> one node's agent: start this node's share of a job."""

    kind: Literal["launch"] = "launch"
    job_id: SafeName
    attempt: int = Field(ge=1)
    fence: int = Field(ge=0, description="reservation fencing token; stale launches are ignored")
    node: SafeName
    node_rank: int = Field(ge=0)
    nnodes: int = Field(ge=1)
    nproc_per_node: int = Field(ge=1)
    gpu_indices: list[int]
    gpu_uuids: list[str]
    master_addr: str
    master_port: int = Field(gt=0, lt=65536)
    rdzv_id: str
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    # The job's packed code (frenzy.state.code_store): the agent unpacks it into a directory of
    # this attempt's own and runs the command there. None: run in ``workdir`` (or the agent's).
    code_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    layout: LayoutEnv
    # Who submitted the job (its Frenzy user, as tokens name it; "" when unknown). Signed with the
    # rest: the agent maps it to the Unix account the job runs as (its --user-map, issue 34).
    user: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
    # The scheduler's --node-dead-after-s when it placed the job: after that long without a heartbeat
    # this node is declared dead and the job run elsewhere, so an agent cut off from Redis stops the
    # job before then (issue 37: no job runs twice). 0: not said (an older scheduler): never stopped so.
    node_dead_after_s: float = Field(default=0.0, ge=0.0, le=86400.0)


class CancelMessage(_Sealed):
    """Scheduler -> agent: stop this job's processes on your node."""

    kind: Literal["cancel"] = "cancel"
    job_id: SafeName
    attempt: int = Field(ge=1)
    reason: str = ""


AgentCommand = Annotated[LaunchMessage | CancelMessage, Field(discriminator="kind")]


# What an EXITED event carries of the job's output: enough for a traceback's end.
TAIL_LINES = 20
TAIL_BYTES = 4096


class EventKind(StrEnum):
    RUNNING = "running"  # the node's process started (pid set)
    EXITED = "exited"  # the node's process ended (exit_code set; negative = killed by signal)
    LAUNCH_FAILED = "launch_failed"  # could not start at all (message says why)


class AgentEvent(_Sealed):
    """Agent -> scheduler: what happened to a job on one node."""

    kind: EventKind
    job_id: str
    attempt: int = Field(ge=1)
    node: str
    # The reservation this process ran under (from the launch). A late event of an
    # older attempt releases exactly the GPUs still held under this fence, never
    # GPUs a newer reservation took.
    fence: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    cancelled: bool = False
    # LAUNCH_FAILED for a reason of this host, not of the job (e.g. its rendezvous
    # port is taken by a foreign process): the scheduler requeues instead of failing.
    retryable: bool = False
    message: str = ""
    log_path: str | None = None
    at: float = Field(default_factory=time.time)
    # EXITED: why it ended (frenzy.agent.exit_cause: "oom", "signal 9 (SIGKILL)", "exit code 1"; "" for
    # exit 0), the last lines of its output (at most TAIL_LINES, TAIL_BYTES in all) and the highest
    # memory one of its GPUs held (bytes; 0: not known), measured by NVML or declared by the job.
    cause: str = Field(default="", max_length=256)
    tail: list[Annotated[str, Field(max_length=TAIL_BYTES)]] = Field(default_factory=list, max_length=TAIL_LINES)
    peak_bytes_per_gpu: int = Field(default=0, ge=0)
    peak_measured: bool = False

    @field_validator("tail")
    @classmethod
    def _tail_bytes(cls, v: list[str]) -> list[str]:
        size = sum(len(line.encode("utf-8", "replace")) + 1 for line in v)
        if size > TAIL_BYTES:
            raise ValueError(f"the output tail is {size} bytes; at most {TAIL_BYTES}")
        return v


class LogChunk(_Msg):
    """Agent -> the job's log stream: the next bytes of one node's log file (whole lines when it can)."""

    node: str
    attempt: int = Field(ge=1)
    offset: int = Field(ge=0, description="byte offset of this text in the node's log file")
    text: str
    at: float = Field(default_factory=time.time)


_command_adapter: TypeAdapter[LaunchMessage | CancelMessage] = TypeAdapter(AgentCommand)


Sealable = TypeVar("Sealable", LaunchMessage, CancelMessage, AgentEvent)


def sealed(msg: Sealable, key: bytes, now: float | None = None, ttl_s: float = signing.LAUNCH_TTL_S) -> Sealable:
    """``msg`` with a fresh nonce, an expiry ``ttl_s`` from ``now`` and its signature under ``key``."""
    seal = signing.seal(msg.model_dump(mode="json"), key, time.time() if now is None else now, ttl_s)
    return msg.model_copy(update={name: seal[name] for name in signing.SIGNED_FIELDS})


def encode(msg: BaseModel) -> dict[str, str]:
    """Stream fields for one message."""
    return {"data": msg.model_dump_json()}


def _payload(fields: dict) -> str:
    raw = fields.get("data", fields.get(b"data"))
    if raw is None:
        raise BadMessage(f"stream entry has no 'data' field (fields: {sorted(map(str, fields))})")
    if isinstance(raw, bytes):
        return raw.decode()
    text = str(raw)
    try:
        text.encode()  # (a str holding a lone surrogate: no writer can store what it decodes to)
    except UnicodeEncodeError as exc:
        raise BadMessage(f"stream entry is not text: {exc}") from exc
    return text


# A JSON escape of a UTF-16 surrogate (\\ud800-\\udfff): a lone one decodes to a str that no UTF-8
# writer takes (the scheduler would fail re-encoding the message it accepted), a pair is fine.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def payload(fields: dict) -> dict[str, Any]:
    """The JSON object of a stream entry, not yet validated (what a seal is checked on)."""
    try:
        text = _payload(fields)
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadMessage(f"stream entry is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise BadMessage(f"stream entry is not a JSON object but {type(obj).__name__}")
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(obj, ensure_ascii=False).encode()
        except (UnicodeEncodeError, ValueError) as exc:
            raise BadMessage("stream entry holds a lone UTF-16 surrogate (not text any writer can store)") from exc
    return obj


def command_from(obj: dict[str, Any]) -> LaunchMessage | CancelMessage:
    """Validate a launch-stream entry's JSON object; raises BadMessage naming what is wrong."""
    try:
        return _command_adapter.validate_python(obj)
    except ValidationError as exc:
        raise BadMessage(f"invalid agent command: {_first_error(exc)}") from exc


def event_from(obj: dict[str, Any]) -> AgentEvent:
    """Validate an events-stream entry's JSON object; raises BadMessage naming what is wrong."""
    try:
        return AgentEvent.model_validate(obj)
    except ValidationError as exc:
        raise BadMessage(f"invalid agent event: {_first_error(exc)}") from exc


def decode_log_chunk(fields: dict) -> LogChunk:
    """Parse a job-log stream entry; raises BadMessage naming what is wrong."""
    try:
        return LogChunk.model_validate_json(_payload(fields))
    except (ValidationError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadMessage(f"invalid log chunk: {_first_error(exc)}") from exc


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "<root>"
        return f"{loc}: {err.get('msg')}"
    return str(exc)
