"""The local stack's ports: distinct within a process, bindable, outside the kernel's ephemeral range
(where outgoing connections would take them between the pick and the service's bind)."""

from __future__ import annotations

import socket

from frenzy.devstack.redis_server import SERVICE_PORTS, free_port


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
