"""A batch entry the scheduler refuses for now (rate limit, queued-jobs quota) is retried with
backoff, not failed at once: RESOURCE_EXHAUSTED is transient to the worker (issue 14 item 8)."""

from __future__ import annotations

import grpc
import pytest
import redis

from frenzy.auth.roles import Role
from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.limits import RateLimit
from frenzy.rpc.server import stop_server
from frenzy.scheduler.service import SchedulerServer, UserQuotas
from frenzy.state.keys import Keys
from frenzy.worker import app as worker_app
from frenzy.worker import batch as B


def test_an_entry_over_the_rate_limit_is_retried(redis_url: str, prefix: str, redis_client: redis.Redis,
                                                 keys: Keys, monkeypatch: pytest.MonkeyPatch) -> None:
    pserver, pport, phealth = serve_predictor("127.0.0.1:0")
    sched = SchedulerServer(redis_url, f"127.0.0.1:{pport}", "127.0.0.1:0", prefix=prefix, tick_s=0.05,
                            quotas=UserQuotas(rate=RateLimit(per_s=0.01, burst=1)))
    try:
        token, _ = sched.tokens.create("batch", Role.SUBMIT)
        monkeypatch.setenv("FRENZY_TOKEN", token)
        entry = {"name": "e", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "true"}
        batch_id = B.new_batch_id()
        B.init_batch(redis_client, keys, batch_id, [entry, entry])
        addr = f"127.0.0.1:{sched.port}"
        first = worker_app.process_entry(batch_id, 0, entry, scheduler=addr, client=redis_client, keys=keys,
                                         final_attempt=False)
        assert first.status == B.SUBMITTED
        with pytest.raises(worker_app.SchedulerUnreachable):
            worker_app.process_entry(batch_id, 1, entry, scheduler=addr, client=redis_client, keys=keys,
                                     final_attempt=False)
        retrying = B.get_outcome(redis_client, keys, batch_id, 1)
        assert retrying is not None and retrying.status == B.RETRYING and "rate limit" in retrying.error
        last = worker_app.process_entry(batch_id, 1, entry, scheduler=addr, client=redis_client, keys=keys,
                                        attempt=6, final_attempt=True)
        assert last.status == B.ERROR and "gave up after 6 attempts" in last.error
    finally:
        sched.stop()
        stop_server(pserver, phealth, grace_s=0.5)
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in worker_app.TRANSIENT_CODES
