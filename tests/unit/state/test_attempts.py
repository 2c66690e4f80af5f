"""The attempt limit (frenzy.state.attempts), pure: stops and out-of-memory re-plans never use up an
attempt, counted ends do, and the limit a requeue names is the one the job shows after it."""

from __future__ import annotations

import itertools

from frenzy.state.attempts import attempt_limit, requeue_limit


def test_every_uncounted_end_adds_one_attempt() -> None:
    assert attempt_limit(1, 0, 0) == 1
    assert attempt_limit(1, 1, 1) == 3
    assert attempt_limit(3, 2, 0) == 5


def test_a_counted_end_fails_the_job_at_its_limit() -> None:
    # --max-attempts 2, no stops: attempt 1 is requeued, attempt 2 fails (requeue_job: attempt >= limit)
    assert requeue_limit(1, 2, 0, 0, counted=True) == 2
    assert requeue_limit(2, 2, 0, 0, counted=True) == 2
    # one re-plan after an out-of-memory exit before: attempt 3 is the second counted one
    assert requeue_limit(3, 2, 0, 1, counted=True) == 3


def test_a_stop_after_an_oom_replan_never_fails_a_job_of_one_attempt() -> None:
    """--max-attempts 1, attempt 1 re-planned after an OOM, attempt 2 stopped by HAS (issue 31)."""
    assert requeue_limit(2, 1, 0, 1, counted=False) == 3 > 2


def test_an_uncounted_end_never_fails_the_job_and_names_the_limit_the_job_shows_after_it() -> None:
    for attempt, most, stops, ooms in itertools.product(range(1, 6), range(1, 4), range(3), range(3)):
        limit = requeue_limit(attempt, most, stops, ooms, counted=False)
        assert limit > attempt  # requeued, whatever the counts say (a limit lowered since included)
        if attempt <= attempt_limit(most, stops, ooms):  # (consistent counts)
            # recorded as one more stop (or OOM): what to_proto shows is the limit the history named
            assert limit == attempt_limit(most, stops + 1, ooms) == attempt_limit(most, stops, ooms + 1)
