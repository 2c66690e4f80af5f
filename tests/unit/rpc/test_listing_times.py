"""The pure parts of issue 30's listing items: the ``since`` dialect the CLI, REST and SDK share,
table times that carry a date unless they are today, and a job's started/ended/run time."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from frenzy.cli.render import job_facts, job_times, when
from frenzy.rpc.listing import since_time
from frenzy.v1 import types_pb2

NOW = dt.datetime(2026, 11, 28, 14, 3, 7).timestamp()  # local time


@pytest.mark.parametrize(("text", "back"), [("30m", 1800), ("2h", 7200), ("7d", 7 * 86400), ("1h30m", 5400),
                                            ("2w", 14 * 86400), ("90s", 90), ("1.5h", 5400), (" 2H ", 7200)])
def test_since_durations_count_back_from_now(text: str, back: float) -> None:
    assert since_time(text, now=NOW) == pytest.approx(NOW - back)


def test_since_dates_are_local_unless_they_name_a_zone() -> None:
    assert since_time("2026-11-27", now=NOW) == dt.datetime(2026, 11, 27).timestamp()
    assert since_time("2026-11-27T09:30", now=NOW) == dt.datetime(2026, 11, 27, 9, 30).timestamp()
    assert since_time("2026-11-27 09:30:15.5", now=NOW) == dt.datetime(2026, 11, 27, 9, 30, 15, 500000).timestamp()
    assert since_time("2026-11-27T09:30Z", now=NOW) == dt.datetime(2026, 11, 27, 9, 30, tzinfo=dt.UTC).timestamp()


def test_since_other_forms_and_no_bound() -> None:
    assert since_time(None) == since_time("") == 0.0
    assert since_time(dt.timedelta(hours=1), now=NOW) == NOW - 3600
    assert since_time(dt.datetime(2026, 11, 1), now=NOW) == dt.datetime(2026, 11, 1).timestamp()
    assert since_time(12345.5) == 12345.5
    assert since_time("100000d", now=NOW) == 0.0  # before 1970: every job, not a negative time


@pytest.mark.parametrize("bad", ["yesterday", "2", "-2h", "2x", "h", "2026-13-01", "1h 30m"])
def test_since_refuses_what_it_cannot_read(bad: str) -> None:
    with pytest.raises(ValueError, match="neither a duration nor a date"):
        since_time(bad, now=NOW)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("inf")])
def test_since_refuses_a_number_that_is_no_time(bad: float) -> None:
    with pytest.raises(ValueError, match="not a time"):
        since_time(bad)


def test_when_shows_the_date_unless_today() -> None:
    assert when(0) == "-"
    assert when(NOW - 3600, now=NOW) == "13:03:07"
    assert when(NOW - 86400, now=NOW) == "2026-11-27 14:03"
    # A 30-day expiry is a date, not "the same time of day".
    assert when(NOW + 30 * 86400, now=NOW) == "2026-12-28 14:03"
    assert when(NOW + 60, date=True, now=NOW) == "2026-11-28 14:04"
    assert when(time.time()).count(":") == 2  # today, as the tables print it


def _job(*history: tuple[str, float]) -> types_pb2.Job:
    job = types_pb2.Job(id="job-1", user="alice", submitted_at=history[0][1])
    for state, at in history:
        job.history.add(state=types_pb2.JobState.Value(f"JOB_STATE_{state}"), at=at)
    return job


def test_job_times_count_only_running_time() -> None:
    t = NOW
    ended = _job(("PENDING", t), ("RESERVED", t + 1), ("LAUNCHING", t + 2), ("RUNNING", t + 3), ("SUCCEEDED", t + 63))
    assert job_times(ended, now=t + 1000) == (t + 3, t + 63, 60.0)
    running = _job(("PENDING", t), ("RUNNING", t + 10))
    assert job_times(running, now=t + 25) == (t + 10, 0.0, 15.0)
    # Requeued after a node loss: the time back in the queue is not run time; started is the first start.
    requeued = _job(("PENDING", t), ("RUNNING", t + 10), ("PENDING", t + 20), ("RUNNING", t + 100),
                    ("FAILED", t + 105))
    assert job_times(requeued, now=t + 1000) == (t + 10, t + 105, 15.0)
    never = _job(("PENDING", t), ("LAUNCHING", t + 1), ("FAILED", t + 2))
    assert job_times(never, now=t + 10) == (0.0, t + 2, 0.0)


def test_job_facts_name_the_user_command_code_and_times() -> None:
    job = _job(("PENDING", NOW), ("RUNNING", NOW + 4), ("SUCCEEDED", NOW + 184))
    job.spec.command.extend(["torchrun", "train.py", "--msg", "two words", "\x1b[31m", "[bold]x"])
    job.spec.code_sha256 = "ab" * 32
    user, command, code = job_facts(job, now=NOW + 500)
    assert user == ("user alice  submitted 2026-11-28 14:03:07  started 2026-11-28 14:03:11 (queued 4.00 s)  "
                    "ended 2026-11-28 14:06:11  ran 3.0 min")
    assert command == "command: torchrun train.py --msg 'two words' '\\x1b[31m' '\\[bold]x'"  # escapes shown, markup inert
    assert code.startswith("code: sha256 abababababab ")
    job.spec.code_sha256 = ""
    job.spec.workdir = "/shared/x"
    assert job_facts(job)[2] == "workdir: /shared/x (on the nodes)"
