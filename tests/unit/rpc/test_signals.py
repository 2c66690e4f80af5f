"""SIGINT/SIGTERM stop a process blocked on an Event, every time (frenzy.signals).

A handler that called ``Event.set()`` itself deadlocked about once in 40 signals when
the signal landed while the main thread held the event's lock inside ``wait``; these
tests send many signals to processes that spend nearly all their time in ``wait``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

CHILD = """
import sys, threading
from frenzy.signals import stop_on_signals
stop = threading.Event()
stop_on_signals(stop, on_signal=lambda sig: print("got", sig.name, flush=True))
print("ready", flush=True)
while not stop.wait(0.0005):  # the lock is taken and released thousands of times a second
    pass
print("stopped", flush=True)
"""


def _spawn() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_process_waiting_on_the_event_every_time(sig: signal.Signals) -> None:
    procs = [_spawn() for _ in range(12)]
    time.sleep(0.05)
    for p in procs:
        p.send_signal(sig)
    outcomes = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=10)
            outcomes.append((p.returncode, out.split()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            outcomes.append(("hung", []))
    assert outcomes == [(0, ["got", sig.name, "stopped"])] * len(procs)


def test_a_second_signal_is_reported_too_and_the_event_stays_set() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.replace('print("stopped", flush=True)',
                                            'import time; time.sleep(0.5); print("stopped", flush=True)')],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().split() == ["got", "SIGINT"]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out.split() == ["got", "SIGTERM", "stopped"]
