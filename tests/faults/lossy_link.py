"""A network link in user space, for the multi-host fault tests: two TAP devices whose frames this
process copies from one to the other, losing a share of them and delaying the rest.

Why: this kernel has no ``netem`` qdisc (``CONFIG_NET_SCH_NETEM`` is off, and no module can be
loaded), so ``tc qdisc add dev VETH root netem loss 30% delay 500ms`` fails with "Specified qdisc
kind is unknown". A TAP pair joined here does what netem would do on a veth, on every frame in
both directions (ARP included, as on a real lossy cable): ``netns.Net.add_host(..., lossy=True)``
puts one TAP in the host's namespace as its ``eth0`` and the other on the test's bridge.

Run as ``python lossy_link.py TAP_A TAP_B`` (root): it creates both TAPs (they vanish with this
process), prints ``ready``, then reads commands on stdin, one a line, answering ``ok`` to each:

* ``set LOSS DELAY_S``: drop each frame with probability LOSS (0..1) and deliver the others
  DELAY_S seconds late, in order (``set 0 0``: a clean wire; ``set 1 0``: the cable pulled);
* ``stats``: frames ``passed dropped`` so far (one line).

Stdlib only; one thread, ``select`` over the two TAPs and stdin. Ends on EOF of stdin.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import random
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
MAX_FRAME = 65536


def open_tap(name: str) -> int:
    """Create the TAP device ``name`` (no packet-info header) -> its file descriptor."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def main(a_name: str, b_name: str, seed: int | None = None) -> None:
    rng = random.Random(seed)
    a, b = open_tap(a_name), open_tap(b_name)
    peer = {a: b, b: a}
    loss, delay = 0.0, 0.0
    queue: list[tuple[float, int, int, bytes]] = []  # (due, sequence, destination fd, frame)
    last_due = {a: 0.0, b: 0.0}  # a frame never overtakes an earlier one (a shorter delay set later)
    seq = passed = dropped = 0
    stdin = sys.stdin.fileno()
    print("ready", flush=True)
    buf = b""
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        readable, _, _ = select.select([a, b, stdin], [], [], timeout)
        for fd in readable:
            if fd == stdin:
                chunk = os.read(stdin, 4096)
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    words = line.decode().split()
                    if words[:1] == ["set"]:
                        loss, delay = float(words[1]), float(words[2])
                        print("ok", flush=True)
                    elif words[:1] == ["stats"]:
                        print(f"{passed} {dropped}", flush=True)
                    else:
                        print(f"error: unknown command {line!r}", flush=True)
                continue
            for _ in range(64):  # drain what is there, a bounded batch per wakeup
                try:
                    frame = os.read(fd, MAX_FRAME)
                except BlockingIOError:
                    break
                except OSError:  # the device went away (its namespace was deleted)
                    return
                if loss and rng.random() < loss:
                    dropped += 1
                    continue
                passed += 1
                seq += 1
                due = last_due[peer[fd]] = max(time.monotonic() + delay, last_due[peer[fd]])
                heapq.heappush(queue, (due, seq, peer[fd], frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dst, frame = heapq.heappop(queue)
            try:
                os.write(dst, frame)
            except (BlockingIOError, OSError):
                dropped += 1  # the device's queue is full or it is down: the frame is lost


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
