"""Turn SIGINT/SIGTERM into a ``threading.Event`` without touching a lock in a signal handler.

Why this exists: a Python-level signal handler runs in the main thread between two
bytecodes, possibly while that thread is inside ``Event.wait`` holding the event's
condition lock. A handler that calls ``Event.set()`` then waits for a lock its own
thread holds, and the process hangs for good (Ctrl-C on ``frenzy up`` did, about
once in 40 tries under load; a second signal does not help). Logging from a handler
has the same problem with the logging lock.

So the handler itself does nothing; ``signal.set_wakeup_fd`` has the interpreter's C
handler write the signal number to a pipe, and a daemon thread reading that pipe sets
the event (and logs) from an ordinary thread.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable, Iterable

DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _ignore(_signum: int, _frame: object) -> None:
    """A Python-level handler must exist for the wakeup fd to be written (and to replace the
    default action, which would kill the process or raise KeyboardInterrupt)."""


def stop_on_signals(
    stop: threading.Event,
    signals: Iterable[signal.Signals] = DEFAULT_SIGNALS,
    on_signal: Callable[[signal.Signals], None] | None = None,
) -> None:
    """Set ``stop`` (after calling ``on_signal``) when one of ``signals`` arrives.

    Call from the main thread (``signal`` requires it). Later signals are delivered to
    ``on_signal`` too; ``stop`` simply stays set.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # set_wakeup_fd requires it: the C handler must never block
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for sig in signals:
        signal.signal(sig, _ignore)

    def watch() -> None:
        while True:
            select.select([read_fd], [], [])
            data = os.read(read_fd, 64)
            if not data:
                return
            for number in data:
                try:
                    sig = signal.Signals(number)
                except ValueError:
                    continue
                if on_signal is not None:
                    on_signal(sig)
                stop.set()

    threading.Thread(target=watch, name="signal-watch", daemon=True).start()
