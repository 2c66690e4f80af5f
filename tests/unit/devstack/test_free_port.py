"""The local stack's ports: distinct within a process and across the processes of a machine (xdist
workers, two `frenzy up`), bindable, outside the kernel's ephemeral range (where outgoing connections
would take them between the pick and the service's bind); Redis, which cannot listen on port 0, is
started again on another port when something else took its own first."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from frenzy.devstack import redis_server
from frenzy.devstack.redis_server import SERVICE_PORTS, PortTaken, free_port, start_redis


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(300)]  # a stack of 100 agents needs a few hundred
    assert len(set(ports)) == len(ports)
    lo, hi = SERVICE_PORTS
    assert all(lo <= p < hi for p in ports)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        ephemeral_low = int(fh.read().split()[0])
    assert hi <= ephemeral_low or ephemeral_low < lo  # (a kernel set to use every port: nothing to avoid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


PICKER = """
import sys
from frenzy.devstack.redis_server import free_port
sys.stdin.readline()  # start together
print(" ".join(str(free_port()) for _ in range(150)), flush=True)
"""


def test_processes_picking_at_once_never_get_the_same_port() -> None:
    # Nothing binds the ports picked here, so each stays free: only the shared reservations keep four
    # processes apart (without them, 4 x 150 random picks of 14,000 ports collide about 10 times).
    procs = [subprocess.Popen([sys.executable, "-c", PICKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]  # fmt: skip
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    picks = [p.communicate(timeout=60)[0].split() for p in procs]
    every = [port for ports in picks for port in ports]
    assert len(every) == 600 and len(set(every)) == 600


def test_a_ledger_directory_others_may_write_is_not_used(tmp_path, monkeypatch) -> None:
    # Another user's (or a group-writable) directory could hold a planted ledger: ignored, and the
    # process's own picks are still distinct.
    shared = tmp_path / f"frenzy-ports-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(redis_server.tempfile, "gettempdir", lambda: str(tmp_path))
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert not (shared / "reserved").exists()


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port a program outside Frenzy holds (bound: a bind by Redis fails with "Address already in use")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_redis_starts_on_another_port_when_its_own_was_taken(held_port: int, monkeypatch) -> None:
    picks = iter([held_port])
    real = redis_server.free_port
    monkeypatch.setattr(redis_server, "free_port", lambda: next(picks, None) or real())
    server = start_redis()
    try:
        assert f":{held_port}/" not in server.url
    finally:
        server.stop()


def test_redis_asked_for_a_taken_port_says_so(held_port: int) -> None:
    with pytest.raises(PortTaken, match=f"did not start on port {held_port}"):
        start_redis(port=held_port)
