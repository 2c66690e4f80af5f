"""Bounded polling for tests: every wait has a deadline and says what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable[[], object], timeout: float = 5.0, what: str = "condition",
             interval: float = 0.02) -> object:
    """Poll ``check`` until it returns something truthy (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
