"""Consumer groups on Redis streams, shared by the scheduler (agent events) and the agents (launches).

Both read their stream in a consumer group so that an entry is acknowledged only
after its effect is done; the group has to exist first, and creating it twice is
not an error. The events stream is trimmed once its entries are acknowledged
(``trim_point``): 2 x 50 MiB an agent wrote there stayed for good before (issue 34).
"""

from __future__ import annotations

import redis


def ensure_group(client: redis.Redis, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` (and the stream itself), reading from its first entry;
    nothing happens when the group is already there."""
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def xreadgroup_entries(reply) -> list[tuple[str, dict | None]]:
    """Flatten an XREADGROUP reply ``[[stream, [(id, fields), ...]], ...]`` to ``[(id, fields)]``.

    A deleted-but-pending entry comes back with empty (or None) fields.
    """
    return [(entry_id, fields) for _stream, entries in reply or [] for entry_id, fields in entries]


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = str(entry_id).partition("-")
    return int(ms), int(seq or 0)


def trim_point(acked: list[str], oldest_pending: str | None) -> str:
    """The MINID to trim a stream read by one consumer group to after acknowledging ``acked``:
    every entry up to the newest of them was delivered (a group delivers in order), so all below
    the oldest still pending (``oldest_pending``, XPENDING's minimum; None when none is) are done
    with. -> the entry id just after the newest acknowledged, or the oldest pending if lower."""
    ms, seq = max(_id(e) for e in acked)
    after = f"{ms}-{seq + 1}"
    if oldest_pending and _id(oldest_pending) < (ms, seq + 1):
        return str(oldest_pending)
    return after


def ack_and_trim(client: redis.Redis, stream: str, group: str, entry_ids: list[str], trimmed_to: str = "") -> str:
    """Acknowledge ``entry_ids`` for ``group`` and trim ``stream`` below its oldest entry still
    pending (another consumer's, a dead leader's stay), whole stream nodes at a time (MINID ~,
    cheap): one round trip (XACK, XPENDING) and an XTRIM unless the point is ``trimmed_to``, where
    the last call trimmed. -> the point trimmed to."""
    pipe = client.pipeline(transaction=False)
    pipe.xack(stream, group, *entry_ids)
    pipe.xpending(stream, group)
    _, pending = pipe.execute()
    oldest = pending.get("min") if pending and pending.get("pending") else None
    minid = trim_point(entry_ids, oldest)
    if minid != trimmed_to:
        client.xtrim(stream, minid=minid, approximate=True)
    return minid
