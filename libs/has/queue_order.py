"""The order a scheduling pass tries the queued jobs in (``QueuePolicy.order``).

FIFO walks by (seq, job id). Shortest-first walks the starving jobs (``starves``: waited
``starvation_s``, and with ``starvation_stretch`` that many times their own ideal runtime)
first (by seq, or with ``StarvingOrder.IDEAL`` by ideal completion), then the rest by the
GPU-seconds of their cheapest plan. Each job becomes a ``QueueRow``: its sort key (cached on
the job's ``JobPlans``), the job and that summary. Priority classes (``QueuedJob.priority``)
come first: the whole queue is walked highest class first, each class in that order.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import cast

from has.policy import QueueOrder, QueuePolicy, StarvingOrder
from has.queued import JobPlans, QueuedJob, plans_of

# One queued job as the pass walks it: (first element of its sort key, its seq, the whole key,
# the job, its plan summary). A tuple typed ``object`` but for the summary: a compiled build
# then does not read the key and the job (to check their types) when the pass unpacks a row;
# ``as_job`` gives the job where it is needed.
#
# Not a small class: a ``@final`` class with these five typed attributes (tried, mypyc-compiled)
# made building and sorting the rows of a 1,000-job queue 0.09 -> 0.13 ms (FIFO) and
# 0.14 -> 0.19 ms (shortest-first) — a native object costs more to allocate than a tuple from
# the free list, and ``attrgetter`` reads it slower than ``itemgetter`` in the sorts — which
# made the frenzy-paper pass 1.2x slower (0.30 -> 0.36 ms; bench/has_decision.py A/B, same
# machine, interleaved runs).
QueueRow = tuple[object, object, object, object, JobPlans]


def as_job(queued: object) -> QueuedJob:
    """A row's job (the row holds it as ``object``)."""
    return cast(QueuedJob, queued)


def starves(info: JobPlans, now: float, policy: QueuePolicy) -> bool:
    """Does the job starve (walked first, may hold GPUs, never a taker of a stopped job's GPUs)?
    It has waited ``starvation_s`` (0: every job starves) and, with ``starvation_stretch``, that
    many times the runtime of its cheapest plan (``JobPlans.ideal_run``). The one test of
    starving for the whole pass."""
    s = policy.starvation_s
    if s <= 0.0:
        return True
    waited = now - info.submitted_at
    if waited < s:
        return False
    stretch = policy.starvation_stretch
    return stretch <= 0.0 or waited >= stretch * info.ideal_run


def queue_order(queue: Sequence[QueuedJob], now: float, policy: QueuePolicy) -> list[QueueRow]:
    """The queue in the order the pass tries it: by (seq, job id); with
    ``order="shortest"``, the starving jobs (``starves``) that way, then the rest by
    (size, seq, job id); with ``starving_order="ideal"`` the starving jobs by (submit time +
    runtime of the cheapest plan, seq, job id). Before all of that, by priority, highest
    first (``by_priority``). (Sort keys are cached per job; job ids are unique, so two rows
    never tie on the key.)"""
    if policy.order is QueueOrder.FIFO:
        rows: list[QueueRow] = []
        for j in queue:
            info = plans_of(j)
            rows.append((info.seq, info.seq, info.fifo_key, j, info))
        return by_priority(sorted_rows(rows))
    # Aging: starving jobs keep FIFO priority, so shortest-first cannot starve a big job.
    ideal = policy.starving_order is StarvingOrder.IDEAL
    starving: list[QueueRow] = []
    rest: list[QueueRow] = []
    for j in queue:
        info = j._has_plans or plans_of(j)  # (plans_of inline: once per job)
        if starves(info, now, policy):
            if ideal:
                starving.append((info.ideal_first, info.seq, info.ideal_key, j, info))
            else:
                starving.append((info.seq, info.seq, info.fifo_key, j, info))
        else:
            rest.append((info.short_first, info.seq, info.short_key, j, info))
    return by_priority(sorted_rows(starving) + sorted_rows(rest))


def _minus_priority(row: QueueRow) -> int:
    return -row[4].priority


def by_priority(rows: list[QueueRow]) -> list[QueueRow]:
    """``rows`` (already in the policy's order) by priority, highest first, in place; a stable
    sort, so each class keeps the policy's order, aging included: a starving job goes before
    the rest of its class, never before a higher class (a priority is the operator's word that
    those jobs matter more). When every job has the same priority (the usual queue), one read
    per row and no sort."""
    if rows:
        first = rows[0][4].priority
        for r in rows:
            if r[4].priority != first:
                rows.sort(key=_minus_priority)
                break
    return rows


_FIRST = operator.itemgetter(0)
_SEQ = operator.itemgetter(1)
_KEY = operator.itemgetter(2)


def sorted_rows(rows: list[QueueRow]) -> list[QueueRow]:
    """``rows`` sorted by their whole key ((first element, seq, job id), or (seq, job id) in
    FIFO order), in place.

    CPython sorts a list whose keys are all floats (or all small ints) with a direct
    comparison, several times faster than comparing tuples item by item (~0.4 ms of a
    1,000-job pass). So, when no first element is NaN: rows in strictly increasing seq order
    (a queue usually comes that way; if not, a sort by seq makes it so when no two seqs are
    equal) are stably sorted by the first element alone, which leaves equal first elements
    in seq order: the same order as the whole key. Only when seqs repeat (or a first element
    is NaN) are tuples compared.
    """
    # (the first elements are ints or floats, typed ``object`` on the row; see QueueRow)
    total = sum(cast("list[float]", [r[0] for r in rows]))  # NaN when one is NaN (or both infinities are there)
    if total == total:
        if not _seq_increasing(rows):
            rows.sort(key=_SEQ)
        if _seq_increasing(rows):
            rows.sort(key=_FIRST)  # stable: rows with equal first elements stay in seq order
            return rows
    rows.sort(key=_KEY)
    return rows


def _seq_increasing(rows: list[QueueRow]) -> bool:
    """Are the rows' seqs strictly increasing (so also distinct)?"""
    prev: int | None = None
    for r in rows:
        seq = cast(int, r[1])  # (QueuedJob.seq, an int, typed ``object`` on the row)
        if prev is not None and seq <= prev:
            return False
        prev = seq
    return True
