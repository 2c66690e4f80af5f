"""The sizes and names a job's code obeys, shared by the client that packs it and the servers
that store and unpack it. Pure constants: the SDK and a client-only install import them without
Redis (``frenzy.state.code_store`` re-exports them for the server side)."""

from __future__ import annotations

import re

SHA256_RE = re.compile(r"[0-9a-f]{64}")
MiB = 1024 * 1024
DEFAULT_MAX_CODE_BYTES = 100 * MiB  # the CLI's --max-code-mib default; the scheduler's FRENZY_MAX_CODE_MIB
CHUNK_BYTES = MiB  # what a client sends per message (well under gRPC's 4 MiB message limit)
MAX_CHUNK_BYTES = 2 * MiB  # what the scheduler accepts per message
