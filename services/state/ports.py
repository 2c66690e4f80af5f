"""The rendezvous port allocator: which torchrun master ports this scheduler may hand out on a
node, as far as it knows. Pure bookkeeping over the port tables the store reads
(``StateStore.port_tables``); ``place_jobs.lua`` checks each port again, so a stale belief
costs a retry, never a double booking."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

# torchrun rendezvous ports handed out per master node; below Linux's ephemeral
# range (32768+), so an outgoing connection never holds one by chance.
DEFAULT_MASTER_PORTS = (29500, 32767)


def port_offset(job_id: str, span: int) -> int:
    """Where in the port range the search for ``job_id``'s rendezvous port starts: derived from the
    job id, so jobs of different stacks (prefixes) sharing a host rarely probe the same ports."""
    return int(uuid.uuid5(uuid.NAMESPACE_URL, job_id).int % span)


class PortAllocator:
    """Each node's rendezvous ports in use, as last read or taken here."""

    def __init__(self) -> None:
        self._used: dict[str, set[int]] = {}

    def known(self, node: str) -> bool:
        """Whether ``node``'s table was read (and not forgotten since)."""
        return node in self._used

    def learn(self, node: str, table: Mapping[str, str]) -> None:
        """``node``'s port table as just read (port -> job id)."""
        self._used[node] = {int(p) for p in table if str(p).isdigit()}

    def pick(self, node: str, job_id: str, ports: tuple[int, int] = DEFAULT_MASTER_PORTS) -> int | None:
        """A rendezvous port on ``node`` that is free as far as this allocator knows (its table
        learnt first), starting at one derived from the job id so stacks sharing a host rarely
        probe the same ports. Counted as taken from now on (two jobs of one batch never get the
        same port); the script checks it again. None when the whole range is taken."""
        first, last = ports
        span = last - first + 1
        used = self._used.setdefault(node, set())
        start = port_offset(job_id, span)
        for step in range(span):
            port = first + (start + step) % span
            if port not in used:
                used.add(port)
                return port
        return None

    def taken(self, node: str, port: int) -> None:
        """``port`` is ``node``'s now (a placement with it went through)."""
        self._used.setdefault(node, set()).add(port)

    def unused(self, node: str, port: int) -> None:
        """``port``, picked for a placement that did not go through, is free again."""
        self._used.get(node, set()).discard(port)

    def forget(self, node: str) -> None:
        """Read ``node``'s port table again before its next placement (a port it thought free was not)."""
        self._used.pop(node, None)
