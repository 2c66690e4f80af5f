"""`frenzy queue hold|release`: jobs are accepted and wait while the queue is held, none is placed,
and the next tick after the release places them."""

from __future__ import annotations

import json

import redis
from typer.testing import CliRunner

from frenzy.cli.main import app
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from support.state import add_node, make_plan, make_spec


def test_held_queue_places_nothing_until_released(redis_client: redis.Redis, keys: Keys, redis_url: str,
                                                  prefix: str) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    loop = SchedulerLoop(redis_client, keys, master_ports=(30000, 30010))
    common = ["--redis-url", redis_url, "--prefix", prefix]
    runner = CliRunner()
    held = runner.invoke(app, ["queue", "hold", "--reason", "firmware update", *common])
    assert held.exit_code == 0, held.output
    job_id, _ = loop.store.submit(make_spec(), [make_plan("A100-80GB", dp=1)], "gpt2-124m", 1)
    report = loop.tick()
    assert report.placed == [] and report.pending == 1
    job = loop.store.get(job_id)
    assert job.state == JobState.PENDING and "held: firmware update" in job.pending_reason
    shown = runner.invoke(app, ["queue", "status", "--json", *common])
    assert json.loads(shown.output) == {"held": True, "reason": "firmware update", "waiting": 1}

    released = runner.invoke(app, ["queue", "release", *common])
    assert released.exit_code == 0 and "released" in released.output
    assert loop.tick().placed == [job_id]
    assert loop.store.get(job_id).state == JobState.LAUNCHING
    again = runner.invoke(app, ["queue", "release", *common])
    assert "was not held" in again.output


def test_hold_needs_a_reason_of_sane_length(redis_url: str, prefix: str, redis_client: redis.Redis,
                                            keys: Keys) -> None:
    out = CliRunner().invoke(app, ["queue", "hold", "--reason", "x" * 501, "--redis-url", redis_url, "--prefix", prefix])
    assert out.exit_code == 2 and "--reason" in out.output
    assert redis_client.get(keys.queue_hold()) is None
