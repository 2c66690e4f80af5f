"""Small CLI fixes from issue 20, each against a real scheduler and Redis (or MARP for `predict`).

`cancel` of an ended job names its state and does not claim the cluster cannot hold it;
single-layout `predict` that does not fit exits 3 after printing the prediction;
`frenzy job` shows the last lines of the job's output, not only where the log file is."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app
from frenzy.state.job_states import JobState
from frenzy.state.store import StateStore
from support.servers import Servers, running_servers
from support.state import make_plan, make_spec

RUN = CliRunner()


@pytest.fixture
def servers(redis_url: str, prefix: str) -> Iterator[Servers]:
    with running_servers(redis_url, prefix) as s:
        yield s


def _ended_job(store: StateStore, state: JobState) -> str:
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    job = store.get(job_id)
    assert job is not None
    moved, _ = store.transition(job, state, "set by the test")
    assert moved
    return job_id


def test_cancel_of_a_cancelled_job_says_so_and_exits_0(servers: Servers, store: StateStore) -> None:
    job_id = _ended_job(store, JobState.CANCELLED)
    res = RUN.invoke(app, ["cancel", job_id, "--scheduler", servers.scheduler_addr])
    assert res.exit_code == 0, res.output
    assert "already ended" in res.output and "CANCELLED" in res.output


def test_cancel_of_a_failed_job_exits_5_naming_the_state(servers: Servers, store: StateStore) -> None:
    job_id = _ended_job(store, JobState.FAILED)
    res = RUN.invoke(app, ["cancel", job_id, "--scheduler", servers.scheduler_addr])
    assert res.exit_code == 5, res.output
    assert "already ended" in res.output and "FAILED" in res.output
    as_json = RUN.invoke(app, ["cancel", job_id, "--scheduler", servers.scheduler_addr, "--json"])
    assert as_json.exit_code == 5
    assert json.loads(as_json.stdout)["state"] == "FAILED"


def test_single_layout_that_does_not_fit_exits_3_after_printing_it() -> None:
    res = RUN.invoke(app, ["predict", "--model", "llama-2-70b", "--seq-len", "4096", "--micro-batch", "1",
                           "--dp", "1", "--gpu", "L4", "--json"])  # fmt: skip
    assert res.exit_code == 3, res.output
    d = json.loads(res.stdout)
    assert d["fits"] is False and d["breakdown"]
    fits = RUN.invoke(app, ["predict", "--model", "gpt2-124m", "--seq-len", "1024", "--micro-batch", "1",
                            "--dp", "1", "--gpu", "A100-80GB", "--json"])  # fmt: skip
    assert fits.exit_code == 0 and json.loads(fits.stdout)["fits"] is True
