"""`frenzy token create|list|revoke` on a real Redis: the token is printed once, works, and stops working."""

from __future__ import annotations

import json

import redis
from typer.testing import CliRunner

from frenzy.auth.tokens import AuthError, TokenStore
from frenzy.cli.cmd_token import parse_ttl
from frenzy.cli.main import app
from frenzy.state.keys import Keys


def test_create_list_revoke(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> None:
    runner = CliRunner()
    common = ["--redis-url", redis_url, "--prefix", prefix]
    made = runner.invoke(app, ["token", "create", "--user", "alice", "--role", "read", "--ttl", "1d",
                               "--note", "dash\x1b[31m", "--json", *common])
    assert made.exit_code == 0, made.output
    out = json.loads(made.output)
    assert out["user"] == "alice" and out["role"] == "read" and out["expires_at"] > 0
    store = TokenStore(redis_client, keys, cache_s=0)
    assert store.verify(out["token"]).user == "alice"
    listed = runner.invoke(app, ["token", "list", *common])
    assert listed.exit_code == 0 and out["id"] in listed.output and "alice" in listed.output
    assert "\x1b" not in listed.output  # a note's escape sequence is shown, not run
    assert out["token"][17:] not in listed.output  # the secret is never listed
    gone = runner.invoke(app, ["token", "revoke", out["id"], *common])
    assert gone.exit_code == 0, gone.output
    try:
        store.verify(out["token"])
        raise AssertionError("a revoked token still works")
    except AuthError:
        pass
    again = runner.invoke(app, ["token", "revoke", out["id"], *common])
    assert again.exit_code == 4 and "no token" in again.output


def test_bad_input_names_the_option(redis_url: str, prefix: str) -> None:
    runner = CliRunner()
    common = ["--redis-url", redis_url, "--prefix", prefix]
    bad_role = runner.invoke(app, ["token", "create", "--user", "a", "--role", "root", *common])
    assert bad_role.exit_code == 2 and "unknown role 'root'" in bad_role.output
    bad_user = runner.invoke(app, ["token", "create", "--user", "../etc", *common])
    assert bad_user.exit_code == 2 and "user" in bad_user.output
    bad_ttl = runner.invoke(app, ["token", "create", "--user", "a", "--ttl", "soon", *common])
    assert bad_ttl.exit_code == 2 and "--ttl" in bad_ttl.output
    no_redis = runner.invoke(app, ["token", "list", "--redis-url", "redis://127.0.0.1:1/0"])
    assert no_redis.exit_code == 1 and "cannot reach Redis" in no_redis.output
    assert parse_ttl("0") == 0 and parse_ttl("90") == 90 and parse_ttl("2h") == 7200
