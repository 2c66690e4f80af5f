"""Hosts of their own for the multi-host fault tests (issue 37): a Linux bridge made for the test and
one network namespace per host, each with its own address on it, and the faults a real network
has — a cable pulled, two hosts cut off from each other, a lossy and slow link.

``Net`` is a context manager; leaving it (a test passed, failed or was interrupted) kills every
process in its namespaces, deletes the namespaces, their links and the bridge, and checks that
nothing of it is left (``leftovers``). Every name carries a random suffix and the creating pid
(``frz-<pid>-<suffix>-<host>`` for namespaces, ``fb<suffix>`` / ``fv<suffix><n>`` /
``ft<suffix><n>a|b`` for the bridge and the links), so parallel xdist workers never collide, and
``sweep_stale`` removes what a killed test run (its pid gone) left behind.

A host's link is a veth pair (its ``eth0`` in the namespace, the other end on the bridge), or with
``lossy=True`` a user-space wire (``lossy_link.py``: two TAP devices joined by a small process that
can lose and delay frames) since this machine's kernel has no ``netem`` qdisc. Faults:

* ``Host.cut`` / ``heal``: the host's switch port down (the bridge-side veth; every packet to or
  from the host is silently lost, as when a cable or a top-of-rack switch fails) and up again;
* ``Host.block(other)`` / ``unblock``: only the traffic between two hosts lost, both ways (a
  ``blackhole`` route in each namespace), the rest of the network still reachable;
* ``Host.impair(loss, delay_s)``: a lossy host's frames lost with probability ``loss`` and the rest
  delayed ``delay_s``, both ways.

Root only (``why_no_namespaces`` says why not, for a skip)."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

NS_PREFIX = "frz-"
_NS_RE = re.compile(r"^frz-(\d+)-([0-9a-f]{6})-")
_LOCK = Path("/tmp/frenzy-netns.lock")
LOSSY_LINK = Path(__file__).with_name("lossy_link.py")


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS`` -> its stdout; raises with ip's message when it fails and ``check``."""
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def namespaces() -> list[str]:
    """Names in ``ip netns list`` (the first word of each line)."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def links() -> list[str]:
    """Network device names in the root namespace."""
    names = []
    for line in ip("-o", "link", "show").splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def ns_pids(ns: str) -> list[int]:
    """Every process in the namespace ``ns`` (``ip netns pids``)."""
    return [int(p) for p in ip("netns", "pids", ns, check=False).split() if p.isdigit()]


def why_no_namespaces() -> str | None:
    """Why this machine cannot make the test's namespaces (a skip's reason), or None when it can."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making network namespaces, veth pairs and a bridge needs root (run the suite as root)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{NS_PREFIX}probe-{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot make a network namespace: {exc}"
    ip("netns", "del", probe, check=False)
    return None


def _kill_namespace_processes(ns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in ``ns`` until none is left (bounded)."""
    deadline = time.monotonic() + timeout_s
    while (pids := ns_pids(ns)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove the namespaces and links of test runs whose process is gone (a worker killed before
    its teardown ran). -> what was removed."""
    removed: list[str] = []
    suffixes: set[str] = set()
    for ns in namespaces():
        m = _NS_RE.match(ns)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        _kill_namespace_processes(ns)
        ip("netns", "del", ns, check=False)
        removed.append(ns)
        suffixes.add(m.group(2))
    for name in links():
        if any(name.startswith(("fb" + s, "fv" + s, "ft" + s)) for s in suffixes):
            ip("link", "del", name, check=False)
            removed.append(name)
    return removed


@contextmanager
def _subnet_lock() -> Iterator[None]:
    with open(_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0-10.254.255.0 that no address or route of the root namespace is in."""
    used = []
    for line in (ip("-4", "-o", "addr", "show") + ip("-4", "route", "show")).splitlines():
        for word in line.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{200 + secrets.randbelow(55)}.{secrets.randbelow(256)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net  # type: ignore[return-value]
    raise RuntimeError("no free 10.x.y.0/24 for the test's bridge")


class LossyLink:
    """The user-space wire of a lossy host (``lossy_link.py``), driven through its stdin."""

    def __init__(self, a: str, b: str, seed: int | None = None) -> None:
        self.a, self.b = a, b
        args = [sys.executable, str(LOSSY_LINK), a, b] + ([str(seed)] if seed is not None else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        if self._line() != "ready":
            raise RuntimeError(f"lossy link {a}<->{b} did not start")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._line()

    def set(self, loss: float, delay_s: float) -> None:
        if self._ask(f"set {loss} {delay_s}") != "ok":
            raise RuntimeError("the lossy link refused a setting")

    def stats(self) -> tuple[int, int]:
        """Frames (passed, dropped) so far."""
        passed, dropped = self._ask("stats").split()
        return int(passed), int(dropped)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@dataclass
class Host:
    """One host: a network namespace with its own address on the test's bridge."""

    net: Net
    name: str
    ns: str
    ip: str
    port_dev: str  # its link's end on the bridge (a veth, or the lossy wire's TAP)
    lossy: LossyLink | None = None
    blocked: set[str] = field(default_factory=set)

    def argv(self, args: list[str]) -> list[str]:
        """``args`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns, *args]

    def cut(self) -> None:
        """Pull the cable: every packet to or from this host is lost (silently, as on a real link)."""
        if self.lossy is not None:
            self.lossy.set(1.0, 0.0)
        else:
            ip("link", "set", self.port_dev, "down")

    def heal(self) -> None:
        """Plug the cable back in (and, on a lossy host, a clean wire again)."""
        if self.lossy is not None:
            self.lossy.set(0.0, 0.0)
        else:
            ip("link", "set", self.port_dev, "up")

    def impair(self, loss: float, delay_s: float) -> None:
        """Lose each frame with probability ``loss`` and delay the rest ``delay_s``, both ways."""
        if self.lossy is None:
            raise RuntimeError(f"host {self.name} was not made with lossy=True")
        self.lossy.set(loss, delay_s)

    def block(self, other: Host) -> None:
        """Lose all traffic between this host and ``other`` (both ways); the rest still flows."""
        ip("-n", self.ns, "route", "add", "blackhole", f"{other.ip}/32")
        ip("-n", other.ns, "route", "add", "blackhole", f"{self.ip}/32")
        self.blocked.add(other.name)

    def unblock(self, other: Host) -> None:
        ip("-n", self.ns, "route", "del", "blackhole", f"{other.ip}/32", check=False)
        ip("-n", other.ns, "route", "del", "blackhole", f"{self.ip}/32", check=False)
        self.blocked.discard(other.name)

    def pids(self) -> list[int]:
        return ns_pids(self.ns)


class Net:
    """A bridge and namespaces made for one test. Use as ``with Net() as net:``."""

    def __init__(self) -> None:
        self.suffix = secrets.token_hex(3)
        self.bridge = f"fb{self.suffix}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""  # the root namespace's address on the bridge (the test process's)
        self.hosts: dict[str, Host] = {}
        self.procs: list[subprocess.Popen] = []
        self._made_bridge = False

    # ---- lifecycle

    def __enter__(self) -> Net:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        sweep_stale()
        with _subnet_lock():
            self.subnet = _free_subnet()
            ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            self.gateway = str(self.subnet.network_address + 1)
            ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")

    def add_host(self, name: str, lossy: bool = False) -> Host:
        """A namespace with ``eth0`` on the bridge at the next free address, and its loopback up."""
        assert self.subnet is not None, "create() first"
        n = len(self.hosts)
        ns = f"{NS_PREFIX}{os.getpid()}-{self.suffix}-{name}"
        address = str(self.subnet.network_address + 10 + n)
        ip("netns", "add", ns)
        host = Host(self, name, ns, address, port_dev="")
        self.hosts[name] = host  # from here on close() removes it, whatever fails next
        if lossy:
            inner, outer = f"ft{self.suffix}{n}a", f"ft{self.suffix}{n}b"
            host.lossy = LossyLink(inner, outer)
            ip("link", "set", inner, "netns", ns)
            ip("-n", ns, "link", "set", inner, "name", "eth0")
            host.port_dev = outer
        else:
            host.port_dev = f"fv{self.suffix}{n}"
            ip("link", "add", host.port_dev, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", host.port_dev, "master", self.bridge)
        ip("link", "set", host.port_dev, "up")
        ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        return host

    def spawn(self, host: Host, args: list[str], log_path: Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        """Start ``args`` in ``host``'s namespace (a session of its own), output to ``log_path``."""
        from frenzy.devstack.procs import die_with_parent

        with open(log_path, "ab") as log:
            proc = subprocess.Popen(host.argv(args), stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, preexec_fn=die_with_parent)
        self.procs.append(proc)
        return proc

    def names(self) -> list[str]:
        """This net's namespaces and root-namespace links that exist now."""
        mine = [ns for ns in namespaces() if ns.startswith(f"{NS_PREFIX}{os.getpid()}-{self.suffix}-")]
        return mine + [name for name in links() if self.suffix in name and name[:2] in ("fb", "fv", "ft")]

    def close(self) -> None:
        """Kill every process of every host, delete the namespaces, links and the bridge. Raises if
        anything of this net is left afterwards."""
        for host in self.hosts.values():
            _kill_namespace_processes(host.ns)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for host in self.hosts.values():
            if host.lossy is not None:
                host.lossy.close()
            ip("netns", "del", host.ns, check=False)
            ip("link", "del", host.port_dev, check=False)  # gone with its namespace or wire, usually
        if self._made_bridge:
            ip("link", "del", self.bridge, check=False)
        deadline = time.monotonic() + 10
        while (left := self.names()) and time.monotonic() < deadline:
            time.sleep(0.1)  # a veth's removal completes asynchronously
        if left:
            raise RuntimeError(f"test network {self.suffix} left behind: {', '.join(left)}")
