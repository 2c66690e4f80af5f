"""Child processes that cannot outlive the process that started them.

`frenzy up`, `frenzy demo` and the tests start services with their own
session (so Ctrl-C reaches them through us, in order), which also means a
SIGKILLed parent would leave them running. On Linux the kernel can send each
child a signal when its parent dies (prctl PR_SET_PDEATHSIG); elsewhere this
is a no-op and the normal stop path is all there is.

Caveat: the signal fires when the *thread* that forked the child exits, so
start children from a thread that lives as long as they should (the main one).
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def _load_prctl():  # noqa: ANN202 - a ctypes function or None
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved here, in the parent, once: a preexec_fn runs in the child between fork and exec,
# where loading a library (dlopen takes the loader's lock, which another thread of the
# parent may have held at the fork) can hang the child — and Popen with it — for good.
_PRCTL = _load_prctl()


def die_with_parent() -> None:
    """preexec_fn for subprocess.Popen: SIGTERM this child when the parent dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
