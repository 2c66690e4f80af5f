"""The agent prunes its node's working directories (codecache.CodeCache.prune through Agent.prune):
an old one of an ended attempt goes, the one of an attempt it runs stays however old it looks."""

from __future__ import annotations

import os
import time
from pathlib import Path

from integration.agent.agent_cluster import SLEEPER, Cluster

from frenzy.agent.codecache import DAY_S, CachePolicy
from frenzy.state.messages import EventKind


def _old_workdir(root: Path, job_id: str) -> Path:
    path = root / job_id / "attempt-1" / "n1"
    path.mkdir(parents=True)
    (path / "out.txt").write_text("what the job wrote\n")
    when = time.time() - 2 * DAY_S
    os.utime(path, (when, when))
    return path


def test_the_agent_prunes_ended_attempts_workdirs_not_a_running_ones(cluster: Cluster) -> None:
    running = cluster.start(cache_policy=CachePolicy(work_max_age_s=DAY_S))
    cluster.launch("job-live", SLEEPER)
    cluster.wait_event("job-live", EventKind.RUNNING)
    work = cluster.log_dir.resolve() / ".agent" / "work"
    live, ended = _old_workdir(work, "job-live"), _old_workdir(work, "job-ended")
    log = cluster.log_dir.resolve() / "job-live" / "attempt-1" / "n1.log"
    when = time.time() - 2 * DAY_S
    os.utime(log, (when, when))  # a quiet job: only its being run here keeps its directory
    report = running.agent.prune()
    assert report.workdirs == ["job-ended/attempt-1/n1"]
    assert not ended.exists() and (live / "out.txt").exists()
