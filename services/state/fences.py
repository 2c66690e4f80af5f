"""The fence block: fencing tokens handed out from a block taken from the shared counter at once,
so a tick's placements cost one ``INCRBY`` per block, not one per placement. Tokens are unique
across schedulers (one counter); a token of a block left unused is skipped, never reused."""

from __future__ import annotations

from collections.abc import Callable


class FenceBlock:
    """Tokens taken from the counter and not handed out yet. ``incrby(n)`` adds ``n`` to the shared
    counter and returns its new value (``StateStore`` passes Redis's INCRBY on ``keys.seq``)."""

    def __init__(self, incrby: Callable[[int], int], block: int = 512) -> None:
        self._incrby = incrby
        self.block = block
        self._left: list[int] = []

    def take(self, count: int) -> list[int]:
        """``count`` fencing tokens never handed out before (a counter round trip only when the
        block runs out)."""
        short = count - len(self._left)
        if short > 0:
            n = max(self.block, short)
            top = int(self._incrby(n))
            self._left.extend(range(top - n + 1, top + 1))
        out, self._left = self._left[:count], self._left[count:]
        return out
