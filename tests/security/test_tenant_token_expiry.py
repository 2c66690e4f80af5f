"""issue 34 (smaller fixes): tokens expire by default and expired ones are removed.

Before: ``frenzy token create`` made tokens that never expire unless ``--ttl`` was given, and an
expired token's record stayed in Redis (and in ``frenzy token list``) for good. Now the default
lifetime is 90 days (``--ttl 0`` for never, said on creation), Redis drops a token's record a
week after it expires (EXPIREAT set with it: "token has expired" answers for that week), and the
index of tokens forgets ids whose record is gone when tokens are listed or swept (every
scheduler sweeps, ``TokenStore.prune``). Against a real Redis, through the real CLI.
"""

from __future__ import annotations

import time

import redis
from typer.testing import CliRunner

from frenzy.auth.roles import Role
from frenzy.auth.tokens import TokenStore
from frenzy.cli.main import app
from frenzy.state.keys import Keys


def test_a_token_made_without_ttl_expires_in_90_days(redis_url: str, prefix: str, redis_client: redis.Redis,
                                                     keys: Keys, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("REDIS_URL", redis_url)
    done = CliRunner().invoke(app, ["token", "create", "--user", "alice", "--prefix", prefix, "--json"])
    assert done.exit_code == 0, done.output
    import json

    made = json.loads(done.output)
    assert abs(made["expires_at"] - (time.time() + 90 * 86400)) < 60, made
    # Redis itself forgets the record a week after it expires.
    ttl = redis_client.ttl(keys.token(made["id"]))
    assert 96 * 86400 < ttl <= 97 * 86400 + 2, ttl
    never = CliRunner().invoke(app, ["token", "create", "--user", "ci", "--ttl", "0", "--prefix", prefix])
    assert never.exit_code == 0 and "never expires" in never.output, never.output


def test_expired_tokens_are_pruned(redis_client: redis.Redis, keys: Keys) -> None:
    store = TokenStore(redis_client, keys, cache_s=0)
    long_ago = time.time() - 30 * 86400
    _, old = store.create("bob", Role.SUBMIT, ttl_s=86400, now=long_ago)  # expired 29 days ago
    _, recent = store.create("carol", Role.SUBMIT, ttl_s=86400, now=time.time() - 2 * 86400)  # 1 day ago
    _, live = store.create("alice", Role.SUBMIT, ttl_s=86400)
    redis_client.sadd(keys.tokens(), "deadbeef0000")  # an index entry whose record is gone
    ids = {t.token_id for t in store.list()}
    assert ids == {recent.token_id, live.token_id}  # the expired within the week is still shown
    assert not redis_client.sismember(keys.tokens(), "deadbeef0000")
    assert not redis_client.sismember(keys.tokens(), old.token_id)
    assert not redis_client.exists(keys.token(old.token_id))
    # A record made before expiry was set in Redis (no TTL) is removed by the sweep all the same.
    redis_client.persist(keys.token(recent.token_id))
    assert store.prune(now=time.time() + 7 * 86400) == 1
    assert {t.token_id for t in store.list()} == {live.token_id}
