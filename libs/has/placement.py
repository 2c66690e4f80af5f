"""Plan matching and GPU placement for one job.

MARP hands the scheduler a ranked list of ``PlanOption``s (GPU type, layout,
predicted bytes per GPU). ``place_job`` walks that list against a
``ClusterView`` and returns either a concrete ``Placement`` (which GPUs on which
nodes, rank 0 first) or a ``PendingReason`` with one line per plan saying, with
numbers, why it does not fit now — in the spirit of an autoscaler's
"infeasible because ..." replies. Pure and deterministic: same view and plans,
same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from has.cluster import ClusterView, HealthySpan, NodeFree

GIB = 1 << 30


def fmt_gib(num_bytes: int) -> str:
    """Bytes as GiB with one decimal, e.g. ``38.2``."""
    return f"{num_bytes / GIB:.1f}"


@dataclass(frozen=True)
class PlanPart:
    """The ranks of one GPU type in one stage of a mixed plan (``PlanOption.parts``): ``gpus`` GPUs
    of ``gpu_type`` in TP groups of ``tp``, each needing ``bytes_per_gpu``."""

    stage: int
    gpu_type: str
    gpus: int
    tp: int
    bytes_per_gpu: int

    def __post_init__(self) -> None:
        if self.tp < 1 or self.gpus < 1 or self.gpus % self.tp:
            raise ValueError(f"PlanPart: {self.gpus} GPUs is not a positive multiple of tp={self.tp}")
        if self.bytes_per_gpu < 0:
            raise ValueError(f"PlanPart.bytes_per_gpu must be >= 0, got {self.bytes_per_gpu}")


@dataclass(frozen=True)
class PlanOption:
    """One layout of a job on one GPU type, with its predicted per-GPU memory need.

    A mixed plan (one job over several GPU types, docs/mixed-plans.md) has ``parts``: its stages'
    ranks per type, in stage order; then ``gpu_type`` is the types sorted and '+'-joined (no node
    has such a type: only the pass's mixed placement, ``choose_mixed``, places it),
    ``tp * pp * dp`` its GPUs and ``bytes_per_gpu`` the least any of its ranks needs."""

    gpu_type: str
    tp: int
    pp: int
    dp: int
    bytes_per_gpu: int
    label: str = ""
    # Estimated seconds the job still needs under this plan (MARP step time x steps left);
    # None when unknown. Read by QueuePolicy(order="shortest", plan_choice="completion").
    runtime_s: float | None = None
    parts: tuple[PlanPart, ...] = ()
    # Estimated dollars of the rest of the run under this plan (its GPUs x their price per
    # GPU-hour x ``runtime_s``; docs/cost.md); None when unknown. Read only for a job whose
    # objective is "cost" (``QueuedJob.objective``, docs/has-policy.md "Deadlines and objectives").
    cost_usd: float | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"PlanOption.{name} must be >= 1, got {getattr(self, name)}")
        if self.parts and sum(p.gpus for p in self.parts) != self.tp * self.pp * self.dp:
            raise ValueError(f"PlanOption: its parts hold {sum(p.gpus for p in self.parts)} GPUs, "
                             f"tp x pp x dp is {self.tp * self.pp * self.dp}")
        if self.bytes_per_gpu < 0:
            raise ValueError(f"PlanOption.bytes_per_gpu must be >= 0, got {self.bytes_per_gpu}")
        if self.runtime_s is not None and not self.runtime_s >= 0:
            raise ValueError(f"PlanOption.runtime_s must be >= 0 or None, got {self.runtime_s}")
        if self.cost_usd is not None and not self.cost_usd >= 0:
            raise ValueError(f"PlanOption.cost_usd must be >= 0 or None, got {self.cost_usd}")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def type_needs(self) -> list[tuple[str, int, int, int]]:
        """(GPU type, GPUs, tp, bytes per GPU) per type of a mixed plan, types in stage order (the
        most any of its ranks of that type needs, the widest TP group); one row for a single type."""
        if not self.parts:
            return [(self.gpu_type, self.tp * self.pp * self.dp, self.tp, self.bytes_per_gpu)]
        rows: dict[str, list[int]] = {}
        for part in self.parts:
            row = rows.get(part.gpu_type)
            if row is None:
                rows[part.gpu_type] = [part.gpus, part.tp, part.bytes_per_gpu]
            else:
                row[0] += part.gpus
                row[1] = max(row[1], part.tp)
                row[2] = max(row[2], part.bytes_per_gpu)
        return [(t, r[0], r[1], r[2]) for t, r in rows.items()]

    def describe(self) -> str:
        """E.g. ``4 × ≥38.2 GiB A100-80GB (tp=2 pp=1 dp=2, 2-GPU TP groups within a node)``."""
        if self.parts:
            types = " + ".join(f"{n} × ≥{fmt_gib(b)} GiB {t}" for t, n, _, b in self.type_needs())
            return f"{types} (mixed plan, {self.pp} stage{'s' if self.pp > 1 else ''}, tp={self.tp})"
        layout = f"tp={self.tp} pp={self.pp} dp={self.dp}"
        if self.tp > 1:
            layout += f", {self.tp}-GPU TP groups within a node"
        if self.label:
            layout += f", {self.label}"
        return f"{self.num_gpus} × ≥{fmt_gib(self.bytes_per_gpu)} GiB {self.gpu_type} ({layout})"


@dataclass(frozen=True)
class Placement:
    """Concrete GPUs for one job: ``nodes`` is ordered, the first node hosts rank 0.

    Each node's GPUs hold consecutive ranks, so a node's share is a multiple of
    ``plan.tp`` and no tensor-parallel group crosses a node boundary.
    """

    job_id: str
    plan_index: int
    plan: PlanOption
    nodes: tuple[tuple[str, tuple[int, ...]], ...]
    # A mixed plan's: per node of ``nodes``, per GPU, the index of the ``plan.parts`` entry (the
    # stage and type) that GPU's rank runs. Empty for a single-type plan.
    parts: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.gpu_count != self.plan.num_gpus:
            raise ValueError(f"placement has {self.gpu_count} GPUs, plan needs {self.plan.num_gpus}")
        for node, indices in self.nodes:
            if not indices or len(indices) % self.plan.tp:
                raise ValueError(f"node {node} gets {len(indices)} GPUs, not a multiple of tp={self.plan.tp}")
        if self.plan.parts:
            if [len(p) for p in self.parts] != [len(i) for _, i in self.nodes]:
                raise ValueError("a mixed placement names the part of every GPU it takes")
            for k, part in enumerate(self.plan.parts):
                if sum(p.count(k) for p in self.parts) != part.gpus:
                    raise ValueError(f"part {k} of the plan needs {part.gpus} GPUs")

    def by_type(self) -> list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]]:
        """(GPU type, its (node, GPU indices)) per type the placement takes (one for a single type)."""
        if not self.plan.parts:
            return [(self.plan.gpu_type, self.nodes)]
        out: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for (node, indices), kinds in zip(self.nodes, self.parts, strict=True):
            per: dict[str, list[int]] = {}
            for index, k in zip(indices, kinds, strict=True):
                per.setdefault(self.plan.parts[k].gpu_type, []).append(index)
            for t, got in per.items():
                out.setdefault(t, []).append((node, tuple(got)))
        return [(t, tuple(nodes)) for t, nodes in out.items()]

    @property
    def gpu_count(self) -> int:
        return sum(len(indices) for _, indices in self.nodes)

    def gpus(self) -> list[tuple[str, int]]:
        """(node, GPU index) in rank order."""
        return [(node, index) for node, indices in self.nodes for index in indices]


class WaitKind(Enum):
    """Why a job is not placed in this pass (lets the service pick a job state)."""

    NO_PLANS = "no_plans"  # the job has no plan at all
    NO_FIT = "no_fit"  # no plan fits the free GPUs now; may fit later
    NEVER_FITS = "never_fits"  # no plan fits even if every job ended (cluster too small)
    RESERVING = "reserving"  # starving head job: holds free GPUs while the rest drain to it
    HELD_FOR_STARVING = "held_for_starving"  # would fit, but on GPUs held for a starving job
    BEHIND_HEAD = "behind_head"  # strict FIFO (backfill off): waits behind the blocked head
    OVER_QUOTA = "over_quota"  # its user holds too many GPUs for any of its plans (max_gpus_per_user)


@dataclass(frozen=True)
class PendingReason:
    """Why a job waits: one human line with numbers, plus one reason per plan tried."""

    summary: str
    per_plan: tuple[str, ...]
    kind: WaitKind = WaitKind.NO_FIT
    # A job with a deadline (``QueuedJob.deadline``): the latest time its fastest plan can start
    # and still finish by it (the deadline - that plan's runtime; in the past once it is missed).
    # None for a job without a deadline or without runtime estimates.
    latest_start: float | None = None


@dataclass(frozen=True)
class _Candidate:
    name: str
    qualifying: int  # free GPUs of the type with enough free memory
    usable: int  # qualifying rounded down to whole TP groups
    free: NodeFree


def _candidates(free: Mapping[str, NodeFree], plan: PlanOption) -> list[_Candidate]:
    out = []
    for name, nf in free.items():
        if len(nf.slots) < plan.tp:
            continue  # cannot host even one TP group; skip the bisect
        qualifying = nf.count_at_least(plan.bytes_per_gpu)
        usable = qualifying - qualifying % plan.tp
        if usable:
            out.append(_Candidate(name, qualifying, usable, nf))
    return out


def choose_nodes(cluster: ClusterView, plan: PlanOption) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """The GPUs ``plan`` would take on ``cluster`` now, rank-0 node first; None if it does not fit.

    A GPU qualifies when it is free, healthy, on a schedulable node, of
    ``plan.gpu_type`` and has ``memory_free >= plan.bytes_per_gpu``. A node's
    usable count is its qualifying count rounded down to a multiple of ``tp``
    (a TP group never spans nodes). Then:

    1. One node if any can hold the whole plan: best fit, i.e. the node with the
       fewest qualifying GPUs that still suffice (leaves big holes for big jobs);
       ties by node name.
    2. Otherwise the fewest nodes k: the smallest k whose k largest usable counts
       reach the need (so the plan is infeasible iff the usable sum falls short).
    3. With k nodes, an equal split (need/k per node, a multiple of tp) when k
       nodes can each give that much — torchrun wants one nproc_per_node; those
       k nodes are picked best-fit (fewest qualifying first, then name) and
       ordered by name.
    4. Else the k-1 largest nodes give all their usable GPUs and the remainder
       goes to the best-fit node among the rest; ordered largest share first.

    Within a node the lowest-index qualifying GPUs are taken.
    """
    return choose_from(cluster.free_by_node(plan.gpu_type), plan)


def choose_from(
    free: Mapping[str, NodeFree], plan: PlanOption
) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """``choose_nodes`` over an explicit name-sorted map of the nodes with free GPUs of the
    plan's type (the scheduling pass keeps its own, shrinking as it places jobs)."""
    need = plan.num_gpus
    b = plan.bytes_per_gpu
    cands = _candidates(free, plan)
    if sum(c.usable for c in cands) < need:
        return None

    singles = [c for c in cands if c.usable >= need]
    if singles:
        best = min(singles, key=lambda c: (c.qualifying, c.name))
        return ((best.name, best.free.take(need, b)),)

    by_size = sorted(cands, key=lambda c: (-c.usable, c.name))
    acc = 0
    k = 0
    for c in by_size:
        acc += c.usable
        k += 1
        if acc >= need:
            break

    if need % k == 0 and (need // k) % plan.tp == 0:
        per = need // k
        fitting = sorted((c for c in cands if c.usable >= per), key=lambda c: (c.qualifying, c.name))
        if len(fitting) >= k:
            chosen = sorted(fitting[:k], key=lambda c: c.name)
            return tuple((c.name, c.free.take(per, b)) for c in chosen)

    head = by_size[: k - 1]
    head_names = {c.name for c in head}
    remainder = need - sum(c.usable for c in head)
    # by_size[k-1] has usable >= remainder, so this is never empty.
    rest = [c for c in cands if c.name not in head_names and c.usable >= remainder]
    tail = min(rest, key=lambda c: (c.qualifying, c.name))
    return tuple((c.name, c.free.take(c.usable, b)) for c in head) + (
        (tail.name, tail.free.take(remainder, b)),
    )


Nodes = tuple[tuple[str, tuple[int, ...]], ...]


def choose_mixed(
    choose: Callable[[PlanOption], Nodes | None], plan: PlanOption
) -> tuple[Nodes, tuple[tuple[int, ...], ...]] | None:
    """The GPUs a mixed plan (``plan.parts``) would take, with each GPU's part; None if one of its
    types does not fit. ``choose``: the single-type rule (``choose_from`` on the free GPUs now).

    Per type, its parts' GPUs are chosen as one single-type plan (the type's widest TP group, the
    most bytes any of its ranks needs: ``PlanOption.type_needs``), so each share lands on nodes of
    its type by the usual rules (TP groups within a node, fewest nodes, best fit). The type's GPUs,
    in that order, go to its parts in stage order: a part's GPUs and a node's share are whole TP
    groups, so no TP group crosses a node. Nodes are ordered by the first stage they run (rank 0 on
    stage 0), then name; a node's GPUs by stage."""
    got: dict[str, list[tuple[int, int]]] = {}  # node -> (part, GPU index)
    for gpu_type, need, tp, need_bytes in plan.type_needs():
        nodes = choose(PlanOption(gpu_type, tp, 1, need // tp, need_bytes))
        if nodes is None:
            return None
        mine = [k for k, part in enumerate(plan.parts) if part.gpu_type == gpu_type]
        slots = [(node, index) for node, indices in nodes for index in indices]
        at = 0
        for k in mine:
            for node, index in slots[at:at + plan.parts[k].gpus]:
                got.setdefault(node, []).append((k, index))
            at += plan.parts[k].gpus
    order = sorted(got, key=lambda n: (min(k for k, _ in got[n]), n))
    rows = [sorted(got[n]) for n in order]
    return (tuple((n, tuple(i for _, i in r)) for n, r in zip(order, rows, strict=True)),
            tuple(tuple(k for k, _ in r) for r in rows))


def explain_plan(cluster: ClusterView, plan: PlanOption) -> str:
    """One line on why ``plan`` does not fit now, with the numbers that matter."""
    return explain_from(cluster.free_by_node(plan.gpu_type), cluster.healthy_span(plan.gpu_type), plan)


def explain_from(free: Mapping[str, NodeFree], healthy: HealthySpan, plan: PlanOption) -> str:
    """``explain_plan`` from the free GPUs of the plan's type per node and its healthy GPUs
    (``ClusterView.healthy_span``: what the scheduling pass keeps)."""
    quals = [(name, nf.count_at_least(plan.bytes_per_gpu), len(nf.slots)) for name, nf in free.items()]
    total_q = sum(q for _, q, _ in quals)
    largest = None
    if total_q:
        name, q, _ = min(quals, key=lambda x: (-x[1], x[0]))
        largest = (name, q)
    return explain_counts(
        plan,
        healthy,
        total_q,
        sum(f for _, _, f in quals),
        sum(q - q % plan.tp for _, q, _ in quals),
        largest,
    )


def explain_counts(
    plan: PlanOption,
    healthy: HealthySpan,
    total_q: int,
    total_free: int,
    usable: int,
    largest: tuple[str, int] | None,
) -> str:
    """``explain_plan`` from the counts it reports: free GPUs of the type with enough memory
    (``total_q``), free ones in all (``total_free``), those in whole TP groups per node
    (``usable``) and the node with the most qualifying (fewest-name tie-break), if any."""
    g = plan.gpu_type
    need = plan.num_gpus
    head = f"needs {plan.describe()}"
    if not healthy.total:
        return f"{head}; no schedulable {g} GPUs in the cluster"
    if plan.tp > healthy.widest:
        return f"{head}; a TP group of {plan.tp} exceeds the largest {g} node ({healthy.widest} GPUs)"

    parts = [head]
    if largest is not None:
        name, q = largest
        parts.append(f"largest free: {q} × {g} on {name}")
        parts.append(f"{total_q} free in total")
    else:
        parts.append(f"largest free: none ({g} free: 0 with enough memory)")
    if total_q >= need > usable:
        parts.append(f"only {usable} of them form whole {plan.tp}-GPU TP groups within a node")
    low_mem = total_free - total_q
    if low_mem:
        parts.append(f"{low_mem} more free {g} skipped: < {fmt_gib(plan.bytes_per_gpu)} GiB free memory")
    if healthy.total < need:
        parts.append(f"the cluster has only {healthy.total} schedulable healthy {g}")
    return "; ".join(parts)


def explain_job(
    cluster: ClusterView, plans: Sequence[PlanOption], kind: WaitKind = WaitKind.NO_FIT
) -> PendingReason:
    """PendingReason for a job none of whose plans fits ``cluster`` now."""
    return explain_with(lambda p: explain_plan(cluster, p), plans, kind)


def explain_with(
    explain: Callable[[PlanOption], str], plans: Sequence[PlanOption], kind: WaitKind = WaitKind.NO_FIT
) -> PendingReason:
    """``explain_job`` with the per-plan line given by ``explain`` (the pass memoises it)."""
    if not plans:
        return PendingReason(
            "no resource plans: the predictor found no layout that fits any GPU type", (), WaitKind.NO_PLANS
        )
    lines = [explain(p) for p in plans]
    per_plan = tuple(f"plan {i}: {line}" for i, line in enumerate(lines))
    summary = lines[0]
    if len(plans) > 1:
        summary += f" (and {len(plans) - 1} fallback plan{'s' if len(plans) > 2 else ''}: none fits now)"
    return PendingReason(summary, per_plan, kind)


def place_job(cluster: ClusterView, job_id: str, plans: Sequence[PlanOption]) -> Placement | PendingReason:
    """Place ``job_id`` on the first plan in ``plans`` that ``cluster`` can satisfy now.

    Plans are tried strictly in the given (ranked) order; the first one for which
    ``choose_nodes`` finds GPUs wins, so a fallback plan is used only when every
    better-ranked plan is infeasible at this moment. See ``choose_nodes`` for the
    node-selection rules (TP groups within a node, single-node best fit, fewest
    nodes, equal split, best fit for the remainder, name tie-breaks).

    Returns a ``Placement`` (``plan_index`` indexes ``plans``) or a
    ``PendingReason`` with one entry per plan tried.
    """
    for i, plan in enumerate(plans):
        nodes = choose_nodes(cluster, plan)
        if nodes is not None:
            return Placement(job_id=job_id, plan_index=i, plan=plan, nodes=nodes)
    return explain_job(cluster, plans)
