"""A job's attempt limit: the one rule the requeue paths and what a job shows share (pure).

A job runs at most ``max_attempts`` attempts that count: its own ``--max-attempts``, else the
scheduler's. Some ends of an attempt never count against it (docs/has-policy.md, docs/failures.md):
a stop by HAS (a preemption, the long-job stop) and an out-of-memory exit that is re-planned (those
have their own limit, ``JobSpec.max_oom_retries``: frenzy.scheduler.oom_policy). Each such end adds
one attempt to the limit, so the limit is always counted attempts plus uncounted ends.
``requeue_job.lua`` takes the limit and fails the job when the attempt that ends is at it.
"""

from __future__ import annotations


def attempt_limit(max_attempts: int, preemptions: int, oom_exits: int) -> int:
    """The last attempt a job may run: ``max_attempts`` counted ones, plus one for every attempt HAS
    stopped (``preemptions``) and every one that ran out of memory (``oom_exits``)."""
    return max_attempts + preemptions + oom_exits


def requeue_limit(attempt: int, max_attempts: int, preemptions: int, oom_exits: int, *, counted: bool) -> int:
    """The limit to requeue the job's ``attempt`` under (the job fails when ``attempt`` is at it).

    ``counted``: this end uses up an attempt (its node was lost, an agent refused the launch). One
    that does not (a stop by HAS, an out-of-memory exit being re-planned) raises the limit by one for
    itself, as ``attempt_limit`` counts it once it is recorded, and never fails the job, whatever
    the counts say (a limit lowered since, records from an older scheduler): at least ``attempt + 1``.
    """
    limit = attempt_limit(max_attempts, preemptions, oom_exits)
    return limit if counted else max(attempt + 1, limit + 1)
