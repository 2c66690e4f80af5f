"""Consumer groups on Redis streams, shared by the scheduler (agent events) and the agents (launches).

Both read their stream in a consumer group so that an entry is acknowledged only
after its effect is done; the group has to exist first, and creating it twice is
not an error.
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
