"""``--run-as USER``: the account a node's jobs run as, resolved once when the agent starts.

An agent that runs as root (it must, to see every process and signal every
job) should not run a stranger's code as root: with ``--run-as`` the job's
command gets that user's uid, primary group and supplementary groups, and the
user's HOME, USER, LOGNAME and SHELL. The shim that records the exit status
stays the agent's (it writes into the agent's log directory); only the command
switches user, in the child, before exec.

Only root can switch: an agent that is not root and names another user is
refused at start rather than failing every launch later.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True)
class JobUser:
    """Who a job runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, the primary one included
    home: str
    shell: str

    def switches(self) -> bool:
        """Running as this user needs a change of identity (the agent is someone else)."""
        return self.uid != os.geteuid() or self.gid != os.getegid()

    def login_env(self) -> dict[str, str]:
        """The variables a login of this user would have, which the agent's own would otherwise fill."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}

    def as_shim_arg(self) -> tuple[int, int, list[int]]:
        """The identity as the shim takes it: uid, gid and the supplementary groups."""
        return (self.uid, self.gid, list(self.groups))


def resolve(user: str) -> JobUser:
    """The account ``user`` (a name or a numeric uid) names; ValueError when there is none or it cannot be used."""
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise ValueError(f"--run-as {user!r}: no such user on this host") from None
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    job_user = JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/",
                       entry.pw_shell or "/bin/sh")
    if job_user.switches() and os.geteuid() != 0:
        raise ValueError(
            f"--run-as {user}: the agent runs as uid {os.geteuid()}, not root, so it cannot start jobs as "
            f"{entry.pw_name} (uid {entry.pw_uid}); run the agent as root, or as {entry.pw_name} without --run-as")
    return job_user
