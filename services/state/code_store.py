"""Jobs' packed code in Redis, content-addressed: the scheduler stores it, agents read it.

A blob is a deterministic tar.gz of a submit directory (``frenzy.code.pack``), stored under
``code:{sha256}`` (``frenzy.state.keys``) where the sha256 is of the blob's bytes. The
scheduler is the only writer (``CodeStore``): an upload (``Scheduler.UploadCode``) is appended
chunk by chunk to a key of its own, its size bounded as it grows and its sha256 computed as it
streams, and renamed to ``code:{sha256}`` only when both match what the client claimed, so a
half-sent or lying upload never becomes a blob anyone reads. The same tree uploaded twice is
stored once: a blob already held is only given a longer life.

Blobs expire ``ttl_s`` after their last use (asked for with ``has``, uploaded, named by a
submission, and renewed by the leading scheduler every ``ttl_s / 8`` while a job that names it
waits or runs: ``renew``), so code of jobs long gone does not fill Redis. Agents read a blob in ranges
(``CodeReader``, a read-only Redis user: ``frenzy.state.acl``) into a file, checking its sha256
before anything is unpacked.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import redis

from frenzy.code.limits import CHUNK_BYTES, DEFAULT_MAX_CODE_BYTES, MAX_CHUNK_BYTES, SHA256_RE, MiB
from frenzy.state.keys import Keys

__all__ = ["CHUNK_BYTES", "DEFAULT_MAX_CODE_BYTES", "MAX_CHUNK_BYTES", "SHA256_RE", "MiB"]  # re-exported
DEFAULT_CODE_TTL_S = 7 * 24 * 3600  # FRENZY_CODE_TTL_S: a blob's life after its last use
UPLOAD_TTL_S = 600  # an abandoned upload's chunks are gone after 10 minutes
READ_BYTES = 8 * MiB  # what an agent reads per GETRANGE


class CodeError(ValueError):
    """An upload or a blob that is not what it claims (size, sha256) or over a limit; the message says which."""


def check_sha256(sha: str, field: str = "sha256") -> str:
    """``sha`` when it is 64 lowercase hex digits; CodeError naming ``field`` otherwise."""
    if not isinstance(sha, str) or SHA256_RE.fullmatch(sha) is None:
        raise CodeError(f"{field}: not a sha256 (64 lowercase hex digits): {str(sha)[:80]!r}")
    return sha


def max_code_bytes_from_env() -> int:
    """The scheduler's limit on one blob: FRENZY_MAX_CODE_MIB (MiB), else 100 MiB."""
    raw = os.environ.get("FRENZY_MAX_CODE_MIB")
    if not raw:
        return DEFAULT_MAX_CODE_BYTES
    try:
        mib = float(raw)
    except ValueError:
        raise ValueError(f"FRENZY_MAX_CODE_MIB={raw!r}: expected a number of MiB, e.g. 100") from None
    if not 0 < mib <= 4096:
        raise ValueError(f"FRENZY_MAX_CODE_MIB={raw!r}: must be above 0 and at most 4096")
    return int(mib * MiB)


@dataclass(frozen=True)
class StoredCode:
    sha256: str
    size: int
    existed: bool  # it was already stored: the upload added nothing


class CodeStore:
    """The scheduler's side: which blobs exist, and uploads that become blobs once they check out."""

    def __init__(self, client: redis.Redis, keys: Keys, max_bytes: int = DEFAULT_MAX_CODE_BYTES,
                 ttl_s: float | None = None) -> None:
        self.r = client
        self.k = keys
        self.max_bytes = max_bytes
        self.ttl_ms = int(1000 * (ttl_s if ttl_s is not None
                                  else float(os.environ.get("FRENZY_CODE_TTL_S") or DEFAULT_CODE_TTL_S)))

    def touch(self, sha: str) -> int | None:
        """The size of blob ``sha`` with its expiry renewed, or None when it is not stored."""
        pipe = self.r.pipeline(transaction=False)
        pipe.pexpire(self.k.code(check_sha256(sha)), self.ttl_ms)
        pipe.strlen(self.k.code(sha))
        renewed, size = pipe.execute()
        return int(size) if renewed else None

    def renew(self, shas: Iterable[str]) -> int:
        """Give every stored blob of ``shas`` its full life again, in one round trip; how many were
        stored. The scheduler's loop renews the code of every job still waiting or running this way
        (``SchedulerLoop.renew_code``), so a job queued longer than the TTL still finds its code."""
        wanted = sorted({sha for sha in shas if SHA256_RE.fullmatch(sha)})
        if not wanted:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for sha in wanted:
            pipe.pexpire(self.k.code(sha), self.ttl_ms)
        return sum(1 for renewed in pipe.execute() if renewed)

    def begin(self, sha: str, size: int) -> CodeUpload:
        """An upload claiming ``size`` bytes with sha256 ``sha``; CodeError when either is unusable."""
        check_sha256(sha)
        if size <= 0:
            raise CodeError(f"size: an upload must say its size in bytes, above 0 (got {size})")
        if size > self.max_bytes:
            raise CodeError(f"size: the code is {size / MiB:.1f} MiB; this scheduler takes at most "
                            f"{self.max_bytes / MiB:.0f} MiB (FRENZY_MAX_CODE_MIB). To fix: leave big files out "
                            "(.gitignore), or keep them on a shared filesystem and submit with --workdir")
        return CodeUpload(self, sha, size)


class CodeUpload:
    """One upload in progress: chunks appended to a key of its own, hashed as they come."""

    def __init__(self, store: CodeStore, sha: str, size: int) -> None:
        self.store = store
        self.sha = sha
        self.size = size
        self.received = 0
        self._hash = hashlib.sha256()
        self._key = store.k.code_upload(uuid.uuid4().hex)

    def add(self, data: bytes) -> None:
        if len(data) > MAX_CHUNK_BYTES:
            raise CodeError(f"data: a chunk of {len(data)} bytes; at most {MAX_CHUNK_BYTES} per message")
        if self.received + len(data) > self.size:
            raise CodeError(f"data: more than the {self.size} bytes the upload claimed")
        self._hash.update(data)
        self.received += len(data)
        pipe = self.store.r.pipeline(transaction=False)
        pipe.append(self._key, data)
        pipe.pexpire(self._key, UPLOAD_TTL_S * 1000)
        pipe.execute()

    def finish(self) -> StoredCode:
        """The blob, once size and sha256 match the claim; CodeError (and nothing stored) otherwise."""
        if self.received != self.size:
            self.abandon()
            raise CodeError(f"size: the upload claimed {self.size} bytes but sent {self.received}")
        got = self._hash.hexdigest()
        if got != self.sha:
            self.abandon()
            raise CodeError(f"sha256: the bytes sent hash to {got}, not the {self.sha} the upload claimed")
        r, final = self.store.r, self.store.k.code(self.sha)
        if self.store.touch(self.sha) is not None:
            self.abandon()  # another upload of the same tree got there first: one copy is enough
            return StoredCode(self.sha, self.size, existed=True)
        pipe = r.pipeline(transaction=True)
        pipe.rename(self._key, final)
        pipe.pexpire(final, self.store.ttl_ms)
        pipe.execute()
        return StoredCode(self.sha, self.size, existed=False)

    def abandon(self) -> None:
        try:
            self.store.r.delete(self._key)
        except redis.RedisError:
            pass  # Redis is down: the chunks expire with the upload key (UPLOAD_TTL_S)


class CodeReader:
    """An agent's side: blob ``sha`` copied into a file in ranges, its sha256 checked on the way."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client  # replies as bytes: a client made with decode_responses=False
        self.k = keys

    def _ranges(self, key: str, size: int) -> Iterator[bytes]:
        for start in range(0, size, READ_BYTES):
            piece = self.r.getrange(key, start, min(size, start + READ_BYTES) - 1)
            if isinstance(piece, str):  # a decoding client would have failed on binary already
                piece = piece.encode("latin-1")
            if not piece:
                return  # expired or replaced meanwhile: the sha256 check below says so
            yield piece

    def fetch(self, sha: str, out: BinaryIO, max_bytes: int) -> int:
        """Write blob ``sha`` to ``out``; its size. CodeError when it is missing, too big or not ``sha``."""
        key = self.k.code(check_sha256(sha))
        size = int(self.r.strlen(key))
        if size == 0:
            raise CodeError(f"code {sha[:12]} is not in the store: it expired (FRENZY_CODE_TTL_S after its last "
                            "use) or was never uploaded. To fix: submit the job again from its directory")
        if size > max_bytes:
            raise CodeError(f"code {sha[:12]} is {size} bytes, above this agent's limit of {max_bytes}")
        digest = hashlib.sha256()
        written = 0
        for piece in self._ranges(key, size):
            digest.update(piece)
            out.write(piece)
            written += len(piece)
        if written != size or digest.hexdigest() != sha:
            raise CodeError(f"code {sha[:12]}: the stored bytes do not hash to their name (got "
                            f"{digest.hexdigest()[:12]}, {written} of {size} bytes); refusing to unpack it")
        return size
