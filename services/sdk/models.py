"""What the SDK hands back: plain, typed dataclasses built from the scheduler's protobuf messages.

Times are unix seconds, sizes bytes, states upper-case names ("PENDING" ... "CANCELLED"). Fields a
scheduler does not send (an older one) keep their defaults, so the SDK reads any version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from frenzy.v1 import types_pb2

if TYPE_CHECKING:
    from frenzy.sdk.client import Client

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
OBJECTIVE_NAMES = {types_pb2.OBJECTIVE_TIME: "time", types_pb2.OBJECTIVE_COST: "cost",
                   types_pb2.OBJECTIVE_GPU_HOURS: "gpu-hours"}


def state_name(value: int) -> str:
    return types_pb2.JobState.Name(value).removeprefix("JOB_STATE_")


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    zero_stage: int
    micro_batch: int
    grad_accum: int
    recompute: str
    vpp: int = 1

    @classmethod
    def from_proto(cls, p: types_pb2.Layout) -> Layout:
        return cls(p.tp, p.pp, p.dp, p.zero_stage, p.micro_batch, p.grad_accum, p.recompute or "none", p.vpp or 1)


@dataclass(frozen=True)
class Plan:
    """A way to run the job: GPU type and count, the parallel layout, MARP's predicted memory and speed."""

    gpu_type: str
    num_gpus: int
    layout: Layout
    peak_bytes_per_gpu: int
    gpu_memory_bytes: int
    step_time_s: float
    tokens_per_s: float
    gpu_hours: float
    completion_s: float
    rank: int
    explanation: str = ""
    cost_usd: float = 0.0  # the whole run at its GPUs' prices per GPU-hour (docs/cost.md); 0: not priced

    @property
    def runtime_s(self) -> float:
        """The predicted run time (``completion_s``), the name `frenzy predict --json` gives it too."""
        return self.completion_s

    @classmethod
    def from_proto(cls, p: types_pb2.Plan) -> Plan:
        return cls(p.gpu_type, p.num_gpus, Layout.from_proto(p.layout), p.peak_bytes_per_gpu, p.gpu_memory_bytes,
                   p.step_time_s, p.tokens_per_s, p.gpu_hours, p.completion_s, p.rank, p.explanation, p.cost_usd)


@dataclass(frozen=True)
class Transition:
    state: str
    at: float
    reason: str

    @classmethod
    def from_proto(cls, p: types_pb2.StateTransition) -> Transition:
        return cls(state_name(p.state), p.at, p.reason)


@dataclass(frozen=True)
class Attempt:
    """One run of the job: the plan it ran with (GPU type, count, layout), MARP's predicted peak
    per GPU and the one observed (None: not measured), how it ended (exit code of the first failing
    node, the recognised cause, that node's last lines) and what the scheduler did next (outcome:
    "running", "succeeded", "failed", "cancelled", "requeued: why")."""

    number: int
    gpu_type: str = ""
    num_gpus: int = 0
    layout: Layout | None = None
    predicted_peak_bytes: int | None = None
    observed_peak_bytes: int | None = None
    gpu_memory_bytes: int = 0
    exit_code: int | None = None
    cause: str = ""
    node: str = ""
    tail: list[str] = field(default_factory=list)
    outcome: str = ""
    ended_at: float = 0.0

    @classmethod
    def from_proto(cls, a: types_pb2.Attempt) -> Attempt:
        return cls(number=a.attempt, gpu_type=a.gpu_type, num_gpus=a.num_gpus,
                   layout=Layout.from_proto(a.layout) if a.HasField("layout") else None,
                   predicted_peak_bytes=a.predicted_peak_bytes or None, observed_peak_bytes=a.observed_peak_bytes or None,
                   gpu_memory_bytes=a.gpu_memory_bytes, exit_code=a.exit_code if a.outcome not in ("", "running") else None,
                   cause=a.cause, node=a.node, tail=list(a.tail), outcome=a.outcome, ended_at=a.ended_at)


def _attempts(p: types_pb2.Job, plan: Plan | None) -> list[Attempt]:
    """The scheduler's record of each attempt; for a job placed by a scheduler that keeps none, its
    current plan as the one attempt (nothing for a job never placed)."""
    recorded = list(getattr(p, "attempts", ()))
    if recorded:
        return [Attempt.from_proto(a) for a in recorded]
    if plan is None:
        return []
    failed = [c for c in p.exit_codes.values() if c != 0]
    return [Attempt(max(1, p.attempt), plan.gpu_type, plan.num_gpus, plan.layout, plan.peak_bytes_per_gpu or None,
                    gpu_memory_bytes=plan.gpu_memory_bytes,
                    exit_code=(failed[0] if failed else 0) if p.exit_codes else None)]


@dataclass
class Job:
    """A job as the scheduler has it now. ``wait()`` follows it to its end; ``refresh()`` reads it again."""

    id: str
    state: str
    name: str
    model: str
    user: str
    attempt: int
    submitted_at: float
    plan: Plan | None
    candidate_plans: list[Plan]
    placement: dict[str, list[int]]
    history: list[Transition]
    attempts: list[Attempt]
    exit_codes: dict[str, int]
    pending_reason: str = ""
    failed_node: str = ""
    failed_exit_code: int = 0
    code_sha256: str = ""
    command: list[str] = field(default_factory=list)
    priority: int = 0  # -100..100, higher starts first
    objective: str = "time"  # time | cost | gpu-hours (docs/cost.md)
    deadline_s: float | None = None  # must finish within this long of submitted_at
    budget_usd: float | None = None  # may cost at most this many dollars
    _client: Client | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_proto(cls, p: types_pb2.Job, client: Any = None) -> Job:
        plan = Plan.from_proto(p.plan) if p.HasField("plan") else None
        return cls(
            id=p.id, state=state_name(p.state), name=p.spec.name, model=p.model_name, user=p.user, attempt=p.attempt,
            submitted_at=p.submitted_at, plan=plan, candidate_plans=[Plan.from_proto(c) for c in p.candidate_plans],
            placement={a.node: list(a.gpu_indices) for a in p.placement},
            history=[Transition.from_proto(t) for t in p.history], attempts=_attempts(p, plan),
            exit_codes=dict(p.exit_codes), pending_reason=p.pending_reason, failed_node=p.failed_node,
            failed_exit_code=p.failed_exit_code, code_sha256=p.spec.code_sha256, command=list(p.spec.command),
            priority=p.spec.priority, objective=OBJECTIVE_NAMES.get(p.spec.goal.objective, "time"),
            deadline_s=p.spec.goal.deadline_s or None, budget_usd=p.spec.goal.budget_usd or None, _client=client)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"

    def _bound(self) -> Client:
        if self._client is None:
            raise RuntimeError("this Job is not bound to a Client; use client.wait(job_id) instead")
        return self._client

    def refresh(self) -> Job:
        """The job as the scheduler has it now (a new object)."""
        return self._bound().get(self.id)

    def wait(self, timeout: float | None = None) -> Job:
        """Follow the job until it ends; the final job. Raises WaitTimeout after ``timeout`` seconds."""
        return self._bound().wait(self.id, timeout=timeout)

    def logs(self, follow: bool = False) -> Any:
        """The job's output, line by line (see ``Client.logs``)."""
        return self._bound().logs(self.id, follow=follow)


@dataclass(frozen=True)
class Prediction:
    """MARP's ranked plans for a job, and why other layouts were rejected."""

    model: str
    parameter_count: int
    plans: list[Plan]
    rejected: list[str]
    dropped: list[str] = field(default_factory=list)  # plans the deadline or budget dropped, with why
