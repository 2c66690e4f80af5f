"""The ACL rules of each role (frenzy.state.acl): pure, no Redis (tests/security/test_redis_acl.py
checks them against real servers)."""

from __future__ import annotations

import hashlib

import pytest

from frenzy.state.acl import (
    RedisRole,
    acl_file_line,
    glob_escape,
    password_hash,
    role_rules,
    setuser_args,
    supports_selectors,
    user_name,
)


def test_an_agent_is_confined_to_its_node() -> None:
    rules = role_rules(RedisRole.AGENT, "fz", "n1")
    keys = {r for r in rules if r.startswith("~")}
    assert keys == {"~fz:node:n1", "~fz:node:n1:alive", "~fz:gpu:n1:*", "~fz:nodes", "~fz:node:n1:logs:*",
                    "~fz:launch:n1", "~fz:events", "~fz:node:n1:key", "~fz:code:*"}
    assert rules[:2] == ("resetchannels", "-@all")
    assert "+@all" not in rules and "+eval" not in rules


def test_on_redis_7_an_agent_only_reads_its_launch_stream_and_key_and_only_appends_events() -> None:
    rules = role_rules(RedisRole.AGENT, "fz", "n1", selectors=True)
    keys = {r for r in rules if r.startswith("~")}
    assert "~fz:launch:n1" not in keys and "~fz:events" not in keys and "~fz:node:n1:key" not in keys
    selectors = [r for r in rules if r.startswith("(")]
    assert selectors == ["(~fz:launch:n1 resetchannels -@all +xreadgroup +xack +xgroup|create)",
                         "(~fz:events resetchannels -@all +xadd)",
                         "(~fz:node:n1:key resetchannels -@all +hget +hmget)",
                    "(~fz:code:* resetchannels -@all +get +getrange +strlen +exists)"]
    assert "~fz:code:*" not in keys  # the packed code: read only, never written by an agent


def test_the_scheduler_has_its_prefix_but_no_administration() -> None:
    rules = role_rules(RedisRole.SCHEDULER, "fz")
    assert [r for r in rules if r.startswith("~")] == ["~fz:*"]
    assert {"-@dangerous", "-@admin", "-script", "+script|load", "resetchannels"} <= set(rules)
    assert "-function" not in rules  # Redis 6.2 has no FUNCTION: ACL SETUSER would refuse it
    assert "-function" in role_rules(RedisRole.SCHEDULER, "fz", selectors=True)


def test_the_worker_has_celery_keys_and_the_batch_keys_only() -> None:
    rules = role_rules(RedisRole.WORKER, "fz", db=3)
    keys = {r for r in rules if r.startswith("~")}
    assert {"~fz:batch:*", "~fz:batches", "~fz:batch-queue*", "~_kombu.*", "~unacked"} <= keys
    assert not [k for k in keys if k.startswith("~fz:") and "batch" not in k]
    assert "&/3.celery.pidbox" in rules  # kombu's channel carries the URL's database number


def test_patterns_escape_glob_characters_of_the_prefix() -> None:
    assert glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
    assert role_rules(RedisRole.SCHEDULER, "x*")[1] == "~x\\*:*"


def test_user_names_passwords_and_lines() -> None:
    assert user_name(RedisRole.AGENT, "fz", "n1") == "fz-agent-n1"
    assert user_name(RedisRole.WORKER, "fz") == "fz-worker"
    with pytest.raises(ValueError):
        user_name(RedisRole.AGENT, "fz")
    with pytest.raises(ValueError):
        role_rules(RedisRole.AGENT, "fz")
    assert password_hash("pw") == "#" + hashlib.sha256(b"pw").hexdigest()
    args = setuser_args("u", "pw", ("~k",))
    assert args == ["u", "reset", "on", password_hash("pw"), "~k"] and "pw" not in args
    assert acl_file_line("u", "pw", ("~k",)) == f"user u reset on {password_hash('pw')} ~k"


@pytest.mark.parametrize(("version", "expected"), [("6.2.14", False), ("7.0.15", True), ("7.2.4", True),
                                                   ("", False), ("x", False)])
def test_selectors_come_with_redis_7(version: str, expected: bool) -> None:
    assert supports_selectors(version) is expected
