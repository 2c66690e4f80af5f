"""The multi-host harness itself (issue 37): hosts reach each other over the test's bridge, the
faults do what they say (a pulled cable, a pair cut off, a lossy wire), and the teardown leaves
nothing — no process, namespace, link or bridge — even when the test body fails."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest
from faults.netns import Net, namespaces, ns_pids, sweep_stale, why_no_namespaces

from support.processes import alive

_WHY_NOT = why_no_namespaces()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"needs network namespaces: {_WHY_NOT}")

CONNECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()\n"
           "except OSError as exc:\n"
           "    sys.exit(f'no: {exc}')\n")


def reaches(net: Net, src: str, ip: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection from host ``src`` to ``ip:port`` opens within ``timeout_s``."""
    out = subprocess.run(net.hosts[src].argv([sys.executable, "-c", CONNECT, ip, str(port), str(timeout_s)]),
                         capture_output=True, text=True, timeout=30)
    return out.returncode == 0


def listen(net: Net, host: str, port: int) -> subprocess.Popen:
    """A TCP server on ``host`` that accepts forever (in the host's namespace)."""
    code = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(({net.hosts[host].ip!r}, {port})); s.listen(64)\n"
            "while True:\n    s.accept()[0].close()\n")
    proc = subprocess.Popen(net.hosts[host].argv([sys.executable, "-c", code]))
    net.procs.append(proc)
    deadline = time.monotonic() + 20
    while not _root_reaches(net.hosts[host].ip, port):
        assert time.monotonic() < deadline, f"the server on {host} did not start"
        time.sleep(0.05)
    return proc


def _root_reaches(ip: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        socket.create_connection((ip, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def test_hosts_talk_and_the_faults_cut_what_they_say() -> None:
    with Net() as net:
        for name in ("a", "b", "c"):
            net.add_host(name)
        listen(net, "a", 7000)
        assert reaches(net, "b", net.hosts["a"].ip, 7000) and reaches(net, "c", net.hosts["a"].ip, 7000)

        net.hosts["b"].block(net.hosts["a"])  # only a <-> b
        assert not reaches(net, "b", net.hosts["a"].ip, 7000)
        assert reaches(net, "c", net.hosts["a"].ip, 7000), "a block cuts one pair, not the network"
        assert _root_reaches(net.hosts["a"].ip, 7000)
        net.hosts["b"].unblock(net.hosts["a"])
        assert reaches(net, "b", net.hosts["a"].ip, 7000)

        net.hosts["a"].cut()  # a's cable: nobody reaches it, silently (a timeout, not a refusal)
        started = time.monotonic()
        assert not reaches(net, "c", net.hosts["a"].ip, 7000, timeout_s=1.0)
        assert time.monotonic() - started >= 0.9, "a cut link loses packets; it does not refuse connections"
        assert not _root_reaches(net.hosts["a"].ip, 7000)
        net.hosts["a"].heal()
        deadline = time.monotonic() + 10
        while not reaches(net, "c", net.hosts["a"].ip, 7000):
            assert time.monotonic() < deadline, "the healed link does not carry traffic"
        names = net.names()
        assert any(n.startswith("frz-") for n in names)
    assert net.names() == [] and not set(names) & set(namespaces())


def test_a_lossy_wire_loses_and_delays_both_ways() -> None:
    with Net() as net:
        net.add_host("srv")
        lossy = net.add_host("far", lossy=True)
        listen(net, "srv", 7001)
        assert reaches(net, "far", net.hosts["srv"].ip, 7001)
        lossy.impair(0.0, 0.3)  # 0.3 s each way: a connection's handshake takes at least 0.6 s
        started = time.monotonic()
        assert reaches(net, "far", net.hosts["srv"].ip, 7001, timeout_s=5)
        assert time.monotonic() - started >= 0.6
        lossy.impair(1.0, 0.0)  # all lost
        assert not reaches(net, "far", net.hosts["srv"].ip, 7001, timeout_s=1.0)
        passed, dropped = lossy.lossy.stats()  # type: ignore[union-attr]
        assert passed > 0 and dropped > 0
        lossy.heal()
        assert reaches(net, "far", net.hosts["srv"].ip, 7001, timeout_s=5)


def test_teardown_removes_everything_when_the_test_fails() -> None:
    """Processes (in their own sessions, as job processes are), namespaces, links and the bridge
    are gone after a failing body, and ``ip netns list`` holds none of the test's names."""
    seen: dict[str, object] = {}
    with pytest.raises(ZeroDivisionError):
        with Net() as net:
            a = net.add_host("a")
            net.add_host("b", lossy=True)
            # a process the harness did not start itself (as a job's, started by an agent)
            subprocess.run(a.argv(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 < /dev/null &"]), check=True,
                           timeout=30)
            deadline = time.monotonic() + 10
            while not ns_pids(a.ns):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            seen.update(pids=ns_pids(a.ns), names=net.names(), wire=net.hosts["b"].lossy.proc.pid)  # type: ignore
            1 / 0  # noqa: B018 -- the test body fails
    # 2 namespaces, the bridge, a's veth and b's outer TAP (the inner ones live in the namespaces)
    assert len(seen["names"]) == 5, seen  # type: ignore[arg-type]
    assert not set(seen["names"]) & set(namespaces())  # type: ignore[arg-type]
    assert net.names() == []
    assert not any(alive(pid) for pid in seen["pids"])  # type: ignore[attr-defined]
    assert not alive(seen["wire"])  # type: ignore[arg-type]


def test_the_leftovers_of_a_killed_run_are_swept() -> None:
    """A worker killed before its teardown leaves namespaces named after its pid: the next ``Net``
    removes them (``sweep_stale``), and never those of a live process."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"frz-{dead.pid}-abcdef-x"
    live = f"frz-{__import__('os').getpid()}-fedcba-x"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    subprocess.run(["ip", "netns", "add", live], check=True)
    try:
        removed = sweep_stale()
        assert stale in removed and stale not in namespaces()
        assert live in namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
        subprocess.run(["ip", "netns", "del", live], capture_output=True)


def test_parallel_nets_do_not_collide() -> None:
    """Two nets at once (as two xdist workers make them): different names and subnets, both work."""
    made: list[Net] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            net = Net()
            net.create()
            made.append(net)
            net.add_host("h")
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert not errors, errors
        assert made[0].suffix != made[1].suffix and made[0].subnet != made[1].subnet
        assert not made[0].subnet.overlaps(made[1].subnet)  # type: ignore[union-attr]
    finally:
        for net in made:
            net.close()
    assert all(net.names() == [] for net in made)
