"""Run a snippet in a fresh interpreter: for what is decided at import time (which build of
HAS loads, environment defaults set by importing Frenzy)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_python(code: str, env: dict[str, str], unset: str) -> str:
    """stdout of ``python -c code`` with this process's environment minus ``unset``, plus
    ``env``; raises if it fails."""
    full = {k: v for k, v in os.environ.items() if k != unset} | env
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout
