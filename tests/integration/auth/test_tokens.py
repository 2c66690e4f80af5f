"""Tokens on a real Redis: stored hashed, checked, expired, revoked."""

from __future__ import annotations

import pytest
import redis

from frenzy.auth.roles import Role
from frenzy.auth.tokens import AuthError, TokenStore
from frenzy.state.keys import Keys


def test_create_verify_revoke(redis_client: redis.Redis, keys: Keys) -> None:
    store = TokenStore(redis_client, keys, cache_s=0.0)
    token, info = store.create("alice", Role.SUBMIT, note="laptop")
    ident = store.verify(token)
    assert (ident.user, ident.role, ident.token_id) == ("alice", Role.SUBMIT, info.token_id)
    # Redis holds a hash of the secret, never the token or its secret
    for value in redis_client.hgetall(keys.token(info.token_id)).values():
        assert token not in value and token[17:] not in value
    # a token with the right id and a wrong secret is refused
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(AuthError, match="unknown or revoked"):
        store.verify(forged)
    assert [t.user for t in store.list()] == ["alice"]
    assert store.revoke(info.token_id)
    with pytest.raises(AuthError, match="unknown or revoked"):
        store.verify(token)
    assert not store.revoke(info.token_id)
    assert store.list() == []


def test_expiry_and_bad_input(redis_client: redis.Redis, keys: Keys) -> None:
    store = TokenStore(redis_client, keys, cache_s=0.0)
    token, info = store.create("bob", Role.READ, ttl_s=60, now=1000.0)
    assert store.verify(token, now=1059.0).user == "bob"
    with pytest.raises(AuthError, match="expired"):
        store.verify(token, now=1060.0)
    with pytest.raises(ValueError, match="user"):
        store.create("../x", Role.READ)
    with pytest.raises(ValueError, match="ttl"):
        store.create("bob", Role.READ, ttl_s=-1)


def test_revocation_reaches_a_cached_checker_within_the_cache_time(redis_client: redis.Redis, keys: Keys) -> None:
    import time
    checker = TokenStore(redis_client, keys, cache_s=0.2)
    admin = TokenStore(redis_client, keys)
    token, info = admin.create("carol", Role.ADMIN)
    assert checker.verify(token).user == "carol"
    admin.revoke(info.token_id)
    time.sleep(0.25)
    with pytest.raises(AuthError):
        checker.verify(token)
