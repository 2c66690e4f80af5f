"""Which running jobs preemption may weigh is one rule (``has.preemption.may_weigh``): the live
scheduler (the cluster read's ``ClusterSnapshot.weighed``, as ``SchedulerLoop.tick`` calls it) and
the simulator (``FrenzyPolicy.decide``) hand ``schedule`` the same running jobs for the same facts.
And how a stopped job's progress is credited (``credit_progress``, ``runtime_left``)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

import has.sim.baselines as baselines
from frenzy.state.cluster_read import ClusterReadModel
from frenzy.state.queue_read import plans_left
from has import ClusterView, PlanOption, QueuedJob, QueuePolicy, RunningJob
from has.preemption import MAX_DONE_FRACTION, credit_progress, may_weigh, runtime_left, weighs_running
from has.sim.baselines import FrenzyPolicy

NOW = 10_000.0
# (job id, submitted_at, started_at, priority, stops): just started, started long ago, started
# moments ago but stopped once before, a high-priority one from an hour ago
FACTS = [("fresh", NOW - 10, NOW - 5, 0, 0), ("old", NOW - 7200, NOW - 7000, 0, 0),
         ("again", NOW - 30, NOW - 20, 0, 1), ("urgent", NOW - 3600, NOW - 3500, 5, 0)]
POLICIES = {
    "frenzy (ranked-wait, long-job stop)": QueuePolicy.frenzy(),
    "frenzy-completion (just-started rule)": QueuePolicy.named("frenzy-completion"),
    "frenzy-nopreempt": QueuePolicy.named("frenzy-nopreempt"),
    "frenzy-paper": QueuePolicy(),
    "ranked-wait with a window too": replace(QueuePolicy.frenzy(), preempt_within_s=60.0),
}


def _live(policy: QueuePolicy, resumable: dict[str, bool]) -> list[RunningJob]:
    """The live path: the owners' rows as the cluster read gets them, then the tick's choice."""
    model = ClusterReadModel()
    model.take_rows([], [], [], [])
    owners = sorted(j for j, *_ in FACTS)
    by_id = {j: f for j, *f in FACTS}
    rows = [("", repr(by_id[j][0]), repr(by_id[j][1]), str(by_id[j][3]), "RUNNING", str(by_id[j][2]),
             "1" if resumable[j] else "", "alice") for j in owners]
    snap = model.build(owners, rows)
    return snap.weighed(policy, NOW) if weighs_running(policy) else []


def _sim(policy: QueuePolicy, monkeypatch: pytest.MonkeyPatch) -> list[RunningJob]:
    """The simulator's path: ``FrenzyPolicy.decide`` on the same running jobs; what it hands
    ``schedule`` is captured."""
    seen: list[Any] = []

    def schedule(cluster: Any, queue: Any, now: float, qp: QueuePolicy, running: Any = ()) -> Any:
        seen.extend(running)
        return SimpleNamespace(preemptions=(), placements=())

    monkeypatch.setattr(baselines, "schedule", schedule)
    sim = FrenzyPolicy("test", policy)
    waiting = QueuedJob("waiting", 99, NOW, (PlanOption("A100-80GB", 1, 1, 1, 1, "", 60.0),))
    sim.queued_job = lambda job: waiting  # type: ignore[method-assign]
    sim._preempted = {j: stops for j, _, _, _, stops in FACTS if stops}
    running = [SimpleNamespace(job_id=j, submitted_at=sub, started_at=start, priority=prio)
               for j, sub, start, prio, _ in FACTS]
    sim.decide(SimpleNamespace(now=NOW, queue=[object()], running=running, cluster=ClusterView([])))  # type: ignore[arg-type]
    return sorted(seen, key=lambda r: r.job_id)


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_live_scheduler_and_the_simulator_weigh_the_same_running_jobs(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = POLICIES[name]
    # every simulated job resumes from its progress: the live facts say so too
    live = _live(policy, {j: True for j, *_ in FACTS})
    assert live == _sim(policy, monkeypatch)


def test_what_each_policy_weighs() -> None:
    every = {j: True for j, *_ in FACTS}
    ids = {name: [r.job_id for r in _live(p, every)] for name, p in POLICIES.items()}
    assert ids["frenzy (ranked-wait, long-job stop)"] == ["again", "fresh", "old", "urgent"]
    assert ids["frenzy-completion (just-started rule)"] == ["again", "fresh"]
    assert ids["frenzy-nopreempt"] == ids["frenzy-paper"] == []
    # the window belongs to the just-started rule, which "ranked-wait" does not run: the long-job
    # stop weighs the jobs that resume, whenever submitted
    assert ids["ranked-wait with a window too"] == ["again", "fresh", "old", "urgent"]


def test_a_job_that_does_not_resume_is_never_weighed_for_the_long_job_stop() -> None:
    # (before the one rule, the live scheduler handed the long-job stop any job submitted within
    # preempt_within_s too, resumable or not, and a stop "keeps" progress such a job does not have)
    resumable = {j: j == "old" for j, *_ in FACTS}
    assert [r.job_id for r in _live(POLICIES["ranked-wait with a window too"], resumable)] == ["old"]
    # the just-started rule weighs a job whether or not it resumes: stopping it loses its progress
    assert [r.job_id for r in _live(POLICIES["frenzy-completion (just-started rule)"], resumable)] == [
        "again", "fresh"]
    assert not may_weigh(QueuePolicy.frenzy(), NOW, NOW - 1.0, False)


def test_a_stopped_jobs_progress_is_credited_and_capped() -> None:
    assert credit_progress(0.0, 1800.0, 3600.0) == 0.5
    assert credit_progress(0.5, 900.0, 3600.0) == 0.75
    assert credit_progress(0.5, 10 * 3600.0, 3600.0) == MAX_DONE_FRACTION  # the estimate ran over
    assert credit_progress(0.25, 100.0, 0.0) == 0.25  # no estimate: nothing new credited
    assert runtime_left(3600.0, 0.75) == 900.0 and runtime_left(None, 0.5) is None
    assert runtime_left(3600.0, 0.0) == 3600.0
    plans = (PlanOption("A100-80GB", 1, 1, 1, 1, "", 3600.0), PlanOption("L4", 1, 1, 1, 1, "", None))
    assert [p.runtime_s for p in plans_left(plans, 0.75)] == [900.0, None]
    assert plans_left(plans, 0.0) is plans
