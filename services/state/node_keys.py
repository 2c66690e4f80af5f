"""Node signing keys in Redis (``Keys.node_key``): made, rotated and read.

The operator makes a node's key (``frenzy node key create NODE``) before its agent
starts; the agent and the scheduler read it to seal and check the node's control
messages (``frenzy.state.signing``). A rotation keeps the old key as ``previous`` so
messages in flight stay valid. Only hex text is stored; nothing here logs a key.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis

from frenzy.state.keys import Keys
from frenzy.state.signing import KeyRing, new_key


class NodeKeyMissing(RuntimeError):
    """A node has no signing key in Redis."""

    def __init__(self, node: str) -> None:
        super().__init__(f"node {node} has no signing key in Redis, so it can neither trust the scheduler's "
                         f"launches nor sign its events. To fix: frenzy node key create {node}")
        self.node = node


def _text(value: str | bytes | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def _ring(current: str | bytes | None, previous: str | bytes | None, rotated_at: str | bytes | None) -> KeyRing | None:
    if not current:
        return None
    try:
        return KeyRing.from_hex(_text(current), _text(previous) or None, float(_text(rotated_at) or 0))
    except ValueError:
        return None  # not a key this code wrote: treated as none, never as a weaker one


def create(client: redis.Redis, keys: Keys, node: str, force: bool = False) -> bool:
    """Give ``node`` a fresh key. -> False when it had one already and ``force`` is not set (kept).

    ``force`` replaces the key and drops the previous one: what is in flight signed with the
    old key is refused (the way to cut off a key that leaked)."""
    key = keys.node_key(node)
    current = new_key().hex()
    if force:
        client.hset(key, mapping={"current": current, "previous": "", "rotated_at": repr(time.time())})
        return True
    if not client.hsetnx(key, "current", current):
        return False
    client.hset(key, mapping={"previous": "", "rotated_at": repr(time.time())})
    return True


def rotate(client: redis.Redis, keys: Keys, node: str) -> None:
    """previous := current, current := a fresh key, atomically. Raises NodeKeyMissing when there is none."""
    key = keys.node_key(node)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                current = pipe.hget(key, "current")
                if not current:
                    raise NodeKeyMissing(node)
                pipe.multi()
                pipe.hset(key, mapping={"current": new_key().hex(), "previous": _text(current),
                                        "rotated_at": repr(time.time())})
                pipe.execute()
                return
            except redis.WatchError:
                continue


def read(client: redis.Redis, keys: Keys, node: str) -> KeyRing | None:
    return _ring(*client.hmget(keys.node_key(node), "current", "previous", "rotated_at"))


def read_many(client: redis.Redis, keys: Keys, nodes: Iterable[str]) -> dict[str, KeyRing | None]:
    """Several nodes' rings in one round trip."""
    names = list(nodes)
    pipe = client.pipeline(transaction=False)
    for n in names:
        pipe.hmget(keys.node_key(n), "current", "previous", "rotated_at")
    return {n: _ring(*row) for n, row in zip(names, pipe.execute(), strict=True)}


def info(client: redis.Redis, keys: Keys, node: str) -> dict[str, str] | None:
    """What an operator may see of a node's key without revealing it: whether it has a previous
    one and when it was made or rotated. None when it has no key."""
    raw = {_text(k): _text(v) for k, v in client.hgetall(keys.node_key(node)).items()}
    if not raw.get("current"):
        return None
    return {"node": node, "has_previous": "yes" if raw.get("previous") else "no",
            "rotated_at": raw.get("rotated_at", "")}
