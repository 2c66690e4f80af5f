"""``--user-map FILE``: which Unix account each Frenzy user's jobs run as on this node.

A shared cluster has many users; if their jobs share one Unix account (``--run-as train``), any job
can read another's environment and code through /proc, overwrite its output and signal it (issue
34, measured). With a map, alice's jobs run as ``alice``'s account and bob's as his, and the kernel's
ordinary rules keep them apart (Slurm does the same: a job runs as its submitter's uid).

The file, one mapping a line (``#`` starts a comment)::

    # frenzy user     unix account
    alice             alice
    bob@lab.example   bob
    carol             2003          # a uid works too

- The Frenzy user is the name tokens carry (``frenzy token create --user``); the launch message
  names it, signed by the scheduler with the node's key, so a job cannot claim another user.
- An account must exist on the host and be an ordinary one: root and system accounts (uid below
  ``--min-job-uid``, 1000 by default, the start of ordinary accounts on Debian and Red Hat) are
  refused when the file is read, with the line and the reason. So is a Frenzy user named twice.
- A job whose user the map does not name is **refused** (LAUNCH_FAILED, not retried, saying who
  and what to add) -- unless the agent runs with ``--unmapped run-as``, which runs such jobs as the
  ``--run-as`` account: convenient, but every unmapped user then shares that one account again.
- The file is read at start (an error stops the agent) and again when it changes (an error then
  keeps the last good map and logs it once), so adding a user needs no restart.

Pure parsing in ``parse``; ``UserMap`` adds the file's reloading.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from frenzy.agent.run_as import JobUser

log = logging.getLogger(__name__)

DEFAULT_MIN_UID = 1000
_FRENZY_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")  # as frenzy.auth.tokens names users
UNMAPPED_CHOICES = ("refuse", "run-as")


class UnmappedUser(RuntimeError):
    """The job's user has no account on this node; the message is what the user reads."""


def account(name: str, min_uid: int = DEFAULT_MIN_UID, what: str = "account") -> JobUser:
    """The ordinary account ``name`` (a name or a uid) as a JobUser; ValueError saying why not."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ValueError(f"{what} {name!r}: no such user on this host") from None
    if entry.pw_uid == 0:
        raise ValueError(f"{what} {name!r} is root: jobs never run as root")
    if entry.pw_uid < min_uid:
        raise ValueError(f"{what} {name!r} (uid {entry.pw_uid}) is a system account (below --min-job-uid "
                         f"{min_uid}): jobs run only as ordinary accounts")
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    if 0 in groups or entry.pw_gid == 0:
        raise ValueError(f"{what} {name!r} is in the root group: jobs never run with it")
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/", entry.pw_shell or "/bin/sh")


def parse(text: str, min_uid: int = DEFAULT_MIN_UID, source: str = "user map",
          resolve: Callable[[str, int, str], JobUser] = account) -> dict[str, JobUser]:
    """``{frenzy user: account}`` from the map's text; ValueError naming the line and what is wrong."""
    out: dict[str, JobUser] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{source} line {number}"
        if len(parts) != 2:
            raise ValueError(f"{where}: expected 'FRENZY_USER UNIX_ACCOUNT', got {raw.strip()!r}")
        user, name = parts
        if not _FRENZY_USER.match(user):
            raise ValueError(f"{where}: {user!r} is not a Frenzy user name (letters, digits, . _ @ -)")
        if user in out:
            raise ValueError(f"{where}: {user!r} is mapped twice")
        out[user] = resolve(name, min_uid, f"{where}: account")
    return out


@dataclass
class _Loaded:
    mapping: dict[str, JobUser]
    stamp: tuple[int, int, int]  # (mtime_ns, size, inode) of the file read


class UserMap:
    """The map file, re-read when it changes; ``user_for`` answers per launch."""

    def __init__(self, path: str, min_uid: int = DEFAULT_MIN_UID, unmapped: str = "refuse",
                 default: JobUser | None = None) -> None:
        if unmapped not in UNMAPPED_CHOICES:
            raise ValueError(f"--unmapped {unmapped!r}: choose one of {', '.join(UNMAPPED_CHOICES)}")
        if unmapped == "run-as" and default is None:
            raise ValueError("--unmapped run-as needs --run-as ACCOUNT: the account unmapped users' jobs run as")
        if os.geteuid() != 0:
            raise ValueError(f"--user-map {path}: the agent runs as uid {os.geteuid()}, not root, so it cannot "
                             "start jobs as their users' accounts; run the agent as root")
        self.path, self.min_uid, self.unmapped, self.default = path, min_uid, unmapped, default
        self._lock = threading.Lock()
        self._loaded = self._read()  # ValueError / OSError stop the agent at start
        log.info("user map %s: %d user(s); jobs of users not in it are %s", path, len(self._loaded.mapping),
                 f"run as {default.name}" if unmapped == "run-as" and default else "refused")

    def _stamp(self) -> tuple[int, int, int]:
        info = os.stat(self.path)
        return (info.st_mtime_ns, info.st_size, info.st_ino)

    def _read(self) -> _Loaded:
        from frenzy.agent import safefile

        stamp = self._stamp()
        text = safefile.read_capped(self.path, 4 << 20, through_dir=False).decode("utf-8")
        return _Loaded(parse(text, self.min_uid, self.path), stamp)

    def _fresh(self) -> dict[str, JobUser]:
        with self._lock:
            try:
                changed = self._stamp() != self._loaded.stamp
            except OSError as exc:
                changed = False
                log.error("user map %s: cannot read it (%s); keeping the last one read", self.path, exc)
            if changed:
                try:
                    self._loaded = self._read()
                    log.info("user map %s re-read: %d user(s)", self.path, len(self._loaded.mapping))
                except (OSError, ValueError) as exc:
                    log.error("user map %s: %s; keeping the last good map", self.path, exc)
                    try:
                        self._loaded.stamp = self._stamp()  # said once, not at every launch
                    except OSError:
                        pass
            return self._loaded.mapping

    def user_for(self, frenzy_user: str, node: str) -> JobUser:
        """The account ``frenzy_user``'s job runs as here; UnmappedUser when it may not run."""
        found = self._fresh().get(frenzy_user) if frenzy_user else None
        if found is not None:
            return found
        if self.unmapped == "run-as" and self.default is not None:
            return self.default
        who = f"user {frenzy_user!r}" if frenzy_user else "a job without a user (from an older scheduler)"
        raise UnmappedUser(f"{who} has no Unix account on node {node}: its operator maps Frenzy users to "
                           f"accounts in {self.path} (a line '{frenzy_user or 'USER'} ACCOUNT')")
