"""What of the agent's environment a job may see, and which variables a job may not set itself.

A job is arbitrary code: whatever the agent's environment holds (the Redis
address with its password, Frenzy tokens) must not reach it, or one job could
forge launches and events on every node. So the job environment is built from
an allowlist, never by copying the agent's: ``ALLOWED`` (what programs expect
from a login: PATH, HOME, the locale, ``LD_LIBRARY_PATH`` for the CUDA
libraries) plus what the operator passes with ``--pass-env NAME`` (a trailing
``*`` matches a prefix: ``NCCL_*``). Names that look like credentials are never
passed, even when a pattern matches them, and naming one in ``--pass-env`` is
refused when the agent starts.

A job's own env may not set the variables Frenzy sets for it (``RESERVED``):
they say which GPUs and rendezvous the job has, so a job that set them would
run on GPUs another job holds. Every front door refuses them at submission
(``frenzy.rpc.jobspec``, ``frenzy.rpc.spec_limits`` import this list), and the
launch check refuses such a launch again on the node.

``FRENZY_CHECKPOINT_DIR`` (``checkpoint_dir``): with the agent's ``--checkpoint-root ROOT``, every
attempt of a job, on every node, gets ``ROOT/<job id>``. The same path across attempts is the
point: a job re-planned after an out-of-memory exit or a lost node finds what its earlier attempt
saved there and resumes instead of starting over (``examples/train_resume.py``). ROOT should be a
filesystem every node shares; without it, no variable is set.

Pure functions: no I/O, no ``os.environ``. Cheap to import (the job-entry validation of every front
door imports it for ``RESERVED``), so heavier imports stay inside the functions that need them.
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frenzy.agent.run_as import JobUser

# From the agent's environment, always (when set there).
ALLOWED = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM",
                     "LD_LIBRARY_PATH"})
ALLOWED_PREFIXES = ("LC_",)

# Frenzy's own credentials and whatever is named like a credential: never from the agent.
CREDENTIALS = frozenset({"REDIS_URL", "FRENZY_TOKEN", "FRENZY_CREDENTIALS"})
_SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN")

# Set by the agent for every launch; a job's env may not set them.
RESERVED = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MASTER_ADDR", "MASTER_PORT", "NNODES",
                      "NODE_RANK", "NPROC_PER_NODE"})
RESERVED_PREFIXES = ("FRENZY_", "PET_")

# What execve takes as a name: no "=", no NUL, not empty.
_NAME = re.compile(r"[^=\x00]+")


def is_credential(name: str) -> bool:
    """A name the agent never hands to a job from its own environment."""
    upper = name.upper()
    return upper in CREDENTIALS or any(word in upper for word in _SECRET_WORDS)


def reserved_names_text() -> str:
    """The reserved names as a user reads them in an error: ``CUDA_VISIBLE_DEVICES, ..., FRENZY_*, PET_*``."""
    return ", ".join([*sorted(RESERVED), *(f"{p}*" for p in RESERVED_PREFIXES)])


def is_reserved(name: str) -> bool:
    """A variable Frenzy sets for every job, which the job's own env may not set."""
    return name in RESERVED or name.startswith(RESERVED_PREFIXES)


def reserved_in(env: Mapping[str, str]) -> list[str]:
    """The names in a job's env that it may not set, sorted."""
    return sorted(name for name in env if is_reserved(name))


def bad_names_in(env: Mapping[str, str]) -> list[str]:
    """Names (or names of values) in a job's env that no process environment can hold."""
    return sorted(name for name, value in env.items() if not _NAME.fullmatch(name) or "\x00" in value)


def check_pass_env(names: Iterable[str]) -> tuple[str, ...]:
    """The ``--pass-env`` names, checked; raises ValueError naming the first one refused."""
    out = []
    for name in names:
        stem = name[:-1] if name.endswith("*") else name
        if not stem or "*" in stem or not _NAME.fullmatch(stem):
            raise ValueError(f"--pass-env {name!r}: give a variable name, or a prefix ending in '*' (e.g. NCCL_*)")
        if is_credential(stem) or (stem != name and any(c.startswith(stem.upper()) for c in CREDENTIALS)):
            raise ValueError(
                f"--pass-env {name!r}: the agent never passes {_what(name)} to jobs "
                f"({', '.join(sorted(CREDENTIALS))} and names containing {'/'.join(_SECRET_WORDS)} are "
                "credentials; a job that had them could act for the agent). Give a job a secret of its own "
                "in its env, or with --env NAME=VALUE")
        if stem == name and is_reserved(name):
            raise ValueError(f"--pass-env {name}: Frenzy sets this for every job itself (reserved)")
        out.append(name)
    return tuple(out)


def check_extra_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The operator's ``--env`` values, checked; raises ValueError for a name the agent must not set."""
    for name, value in extra.items():
        if not _NAME.fullmatch(name) or "\x00" in value:
            raise ValueError(f"--env {name!r}: not a valid environment variable")
        if name.upper() in CREDENTIALS:
            raise ValueError(f"--env {name}: Frenzy's own credentials never go to jobs")
        if is_reserved(name):
            raise ValueError(f"--env {name}: Frenzy sets this for every job itself (reserved)")
    return dict(extra)


def inherited(agent_env: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """What a job gets from the agent's environment: the allowlist and ``pass_env``, never a credential."""
    exact = set(ALLOWED)
    prefixes = list(ALLOWED_PREFIXES)
    for name in pass_env:
        if name.endswith("*"):
            prefixes.append(name[:-1])
        else:
            exact.add(name)
    return {name: value for name, value in agent_env.items()
            if (name in exact or name.startswith(tuple(prefixes))) and not is_credential(name)
            and not is_reserved(name)}


def _what(name: str) -> str:
    return f"variables matching {name}" if name.endswith("*") else name


def contract_env(contract: Mapping[str, str]) -> dict[str, str]:
    """A mixed plan's launch contract as the job's environment: the five ``FRENZY_STAGE`` ..
    ``FRENZY_LOSS_SCALE`` variables of the launch's layout (``LayoutEnv.contract``, checked whole
    when the message was read), one value or one per local rank (``frenzy.train.contract``). Empty
    for a single-type plan: a homogeneous job gets none of them (and its own env cannot set them:
    ``FRENZY_*`` is reserved)."""
    return dict(contract)


def contract_placeholders(contract: Mapping[str, str]) -> dict[str, str]:
    """``{stage_layers}`` and ``{local_micro_batch}`` for the command line of a node whose ranks
    agree on them (``FIRST-LAST``, an integer); one whose ranks differ (two stages on one node) gets
    neither, the placeholder stays as written, and the script reads the variable per rank. A
    single-type plan: the whole model is one stage ({stage_layers} unset) and every rank runs the
    plan's micro-batch (``placeholder_values`` gives ``{micro_batch}``)."""
    from frenzy.train.contract import LOCAL_MICRO_BATCH, STAGE_LAYERS

    out = {}
    for key, name in (("stage_layers", STAGE_LAYERS), ("local_micro_batch", LOCAL_MICRO_BATCH)):
        value = contract.get(name, "")
        if value and "," not in value:
            out[key] = value
    return out


CHECKPOINT_DIR_VAR = "FRENZY_CHECKPOINT_DIR"


def check_checkpoint_root(root: str) -> str:
    """The ``--checkpoint-root`` as given, normalised; raises ValueError unless it is an absolute path.

    Absolute because every node (and every restart of an agent, from whatever directory) must name
    the same place: a relative root would resolve against each agent's own working directory.
    """
    if not root or "\x00" in root or not posixpath.isabs(root):
        raise ValueError(f"--checkpoint-root {root!r}: give an absolute path (a directory every node shares, "
                         "e.g. /shared/frenzy/checkpoints)")
    return posixpath.normpath(root)


def checkpoint_dir(root: str, job_id: str) -> str:
    """``ROOT/<job id>``: the job's checkpoint directory, the same for every attempt and node.

    Raises ValueError for a job id that could name anything but one directory right under ROOT
    (launch messages only carry safe ids, ``messages.SafeName``; this is the second lock).
    """
    from frenzy.state.messages import is_safe_name

    root = check_checkpoint_root(root)
    if not is_safe_name(job_id) or job_id in (".", ".."):
        raise ValueError(f"job id {job_id!r}: not a safe name; no checkpoint directory for it")
    path = posixpath.join(root, job_id)
    if posixpath.dirname(posixpath.normpath(path)) != root:
        raise ValueError(f"job id {job_id!r}: its checkpoint directory would leave {root}")
    return path


def workdir_roots(given: list[str | os.PathLike[str]] | None, user: JobUser | None) -> tuple[str, ...]:
    """Resolved directories a job's working directory must lie in (``--workdir-root``).

    Default: the home of the user jobs run as, the agent's current directory and
    the system temp directory. "/" is never a default (an agent started from "/"
    by an init system would otherwise allow /etc); an operator may still name it.
    """
    if given:
        roots = [os.path.realpath(os.fspath(p)) for p in given]
    else:
        home = user.home if user is not None else os.path.expanduser("~")
        roots = [os.path.realpath(p) for p in (home, os.getcwd(), tempfile.gettempdir())]
        roots = [r for r in roots if r != os.sep]
    return tuple(dict.fromkeys(roots))
