"""Small CLI fixes from issue 20, each against a real scheduler and Redis (or MARP for `predict`).

`cancel` of an ended job names its state and does not claim the cluster cannot hold it;
single-layout `predict` that does not fit exits 3 after printing the prediction;
`frenzy job` shows the last lines of the job's output, not only where the log file is; a `--model`
path that is not there says "file not found", not "unknown model", and the README's exists."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from frenzy.cli.main import app
from frenzy.state import scripts
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import LogChunk
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
    assert store.transition(job, state, "set by the test").done
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


def _ship(client: redis.Redis, keys: Keys, job_id: str, node: str, text: str) -> None:
    """Append output the way an agent does (its own script)."""
    append = scripts.register(client, "append_log")
    chunk = LogChunk(node=node, attempt=1, offset=0, text=text)
    append(keys=[keys.job_logs(job_id, node), keys.job_log_offsets(job_id, node)],
           args=[f"{node}/1", 0, len(text.encode()), 1000, chunk.model_dump_json(), 60_000])


def test_job_shows_the_last_lines_of_its_output(servers: Servers, store: StateStore, redis_client: redis.Redis,
                                                keys: Keys) -> None:
    job_id = _ended_job(store, JobState.FAILED)
    store.set_fields(job_id, **{"log:gpu-0": "/var/log/frenzy/job.log"})
    quiet = RUN.invoke(app, ["job", job_id, "--scheduler", servers.scheduler_addr])
    assert quiet.exit_code == 0, quiet.output
    assert "no output yet" in quiet.output
    _ship(redis_client, keys, job_id, "gpu-0", "".join(f"step {i}\n" for i in range(1, 31)))
    res = RUN.invoke(app, ["job", job_id, "--scheduler", servers.scheduler_addr])
    assert res.exit_code == 0, res.output
    assert "/var/log/frenzy/job.log" in res.output  # the path stays
    assert "step 30" in res.output and "step 11" in res.output
    assert "step 10\n" not in res.output  # only the last 20 lines


@pytest.mark.parametrize("cmd", [
    ["predict", "--seq-len", "2048", "--global-batch", "32"],  # through the predictor's path
    ["predict", "--seq-len", "2048", "--global-batch", "32", "--precision", "amp-bf16"],  # MARP's own
    ["submit", "--seq-len", "2048", "--global-batch", "32", "--scheduler", "127.0.0.1:1", "--", "python", "t.py"],
])
def test_a_model_path_that_is_not_there_says_file_not_found(cmd: list[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = RUN.invoke(app, [cmd[0], "--model", "./config.json", *cmd[1:]])
    assert res.exit_code == 2, res.output
    assert "file not found: './config.json'" in res.output and "unknown model" not in res.output
    assert "To fix:" in res.output
    (tmp_path / "models").mkdir()
    res = RUN.invoke(app, [cmd[0], "--model", "./models", *cmd[1:]])
    assert res.exit_code == 2 and "is a directory: './models'" in res.output, res.output


def test_the_readme_model_paths_exist() -> None:
    root = Path(__file__).resolve().parents[3]
    paths = re.findall(r"--model (\S*/\S*)", (root / "README.md").read_text())
    assert paths, "the README shows --model with a config path"
    for path in paths:
        assert (root / path).is_file(), f"README: --model {path}: no such file in the repository"
        res = RUN.invoke(app, ["predict", "--model", str(root / path), "--seq-len", "2048", "--global-batch", "32",
                               "--json"])
        assert res.exit_code == 0, res.output
