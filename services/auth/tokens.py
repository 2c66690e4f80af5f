"""API tokens: made once, shown once, stored only as a hash, checked on every call.

A token reads ``frz_<id>_<secret>``: ``id`` (12 hex digits) names the record in Redis so
a check is one HGETALL, ``secret`` is 32 random bytes (URL-safe base64). Redis keeps
SHA-256 of the secret, never the secret, so a copy of Redis' data gives nobody a token.
A fast hash is enough here, unlike for passwords: with 256 random bits there is nothing
to guess, which is why GitHub and Kubernetes bootstrap tokens are stored the same way.
The ``frz_`` prefix lets secret scanners recognise a leaked token.

Checks are cached in-process for a few seconds (``CACHE_S``), so a revocation takes
effect on every server within that time; the cache is what lets a busy scheduler check
a token per call without a Redis round trip each time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass

import redis

from frenzy.auth.roles import Role
from frenzy.state.keys import Keys

PREFIX = "frz_"
_TOKEN_RE = re.compile(r"^frz_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_USER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
CACHE_S = 5.0


class AuthError(Exception):
    """The caller is not who it says (no token, a malformed, unknown, expired or revoked one)."""


@dataclass(frozen=True)
class Identity:
    """Who is calling: the user a token was made for, and its role."""

    user: str
    role: Role
    token_id: str


@dataclass(frozen=True)
class TokenInfo:
    """A stored token as `frenzy token list` shows it (never the secret)."""

    token_id: str
    user: str
    role: Role
    created_at: float
    expires_at: float  # 0: never
    note: str

    def expired(self, now: float) -> bool:
        return self.expires_at > 0 and now >= self.expires_at


def validate_user(user: str) -> str:
    if not _USER_RE.match(user):
        raise ValueError(f"user: {user!r} is not a valid user name (letters, digits, . _ @ -; at most 64, "
                         "starting with a letter or digit)")
    return user


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str]:
    """-> (id, secret); AuthError naming the problem (never echoing the token)."""
    m = _TOKEN_RE.match(token.strip())
    if not m:
        raise AuthError("token is malformed (expected frz_<12 hex>_<43 characters>)")
    return m.group(1), m.group(2)


def bearer(header: str | None) -> str:
    """The token in an ``authorization: Bearer <token>`` value; AuthError if absent."""
    if not header:
        raise AuthError("no token")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise AuthError("authorization must be 'Bearer <token>'")
    return value.strip()


_UNKNOWN = TokenInfo("", "", Role.READ, 0.0, 0.0, "")  # the record an unknown id is checked against
_STAND_IN = _digest(secrets.token_urlsafe(32))  # a digest no secret has, compared in its place


# How long an expired token's record stays (it answers "token has expired", `frenzy token list`
# shows it): then Redis drops it (EXPIREAT, set with the token) or ``TokenStore.prune`` does.
EXPIRED_KEPT_S = 7 * 86400


class TokenStore:
    """Tokens in Redis: ``{p}:token:{id}`` hashes and the ``{p}:tokens`` set of ids."""

    def __init__(self, client: redis.Redis, keys: Keys, cache_s: float = CACHE_S) -> None:
        self.r = client
        self.k = keys
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, str, TokenInfo]] = {}
        self._lock = threading.Lock()

    def create(self, user: str, role: Role, note: str = "", ttl_s: float = 0.0,
               now: float | None = None) -> tuple[str, TokenInfo]:
        """A new token -> (the token, its record). The token is not kept anywhere: show it once."""
        validate_user(user)
        if ttl_s < 0:
            raise ValueError(f"ttl: must be >= 0 seconds (got {ttl_s})")
        if len(note) > 256:
            raise ValueError("note: at most 256 characters")
        now = time.time() if now is None else now
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        info = TokenInfo(token_id, user, role, now, now + ttl_s if ttl_s else 0.0, note)
        pipe = self.r.pipeline(transaction=True)  # the record and its index together
        pipe.hset(self.k.token(token_id), mapping={
            "user": user, "role": role.value, "sha256": _digest(secret),
            "created_at": repr(info.created_at), "expires_at": repr(info.expires_at), "note": note,
        })
        pipe.sadd(self.k.tokens(), token_id)
        drop_at = int(info.expires_at + EXPIRED_KEPT_S) + 1
        if info.expires_at and drop_at > time.time():  # Redis drops the record itself (issue 34)
            pipe.expireat(self.k.token(token_id), drop_at)
        pipe.execute()
        return f"{PREFIX}{token_id}_{secret}", info

    def _load(self, token_id: str) -> tuple[str, TokenInfo] | None:
        raw = self.r.hgetall(self.k.token(token_id))
        if not raw:
            return None
        f = {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
             for k, v in raw.items()}
        try:
            info = TokenInfo(token_id, f["user"], Role(f["role"]), float(f["created_at"]),
                             float(f.get("expires_at") or 0), f.get("note", ""))
        except (KeyError, ValueError):
            return None  # a damaged record authenticates nobody
        return f["sha256"], info

    def verify(self, token: str, now: float | None = None) -> Identity:
        """The identity a token stands for; AuthError if it does not stand for one."""
        token_id, secret = parse_token(token)
        mono = time.monotonic()
        with self._lock:
            hit = self._cache.get(token_id)
        if hit is None or hit[0] <= mono:
            # An unknown id goes through the same steps as a known one (its record's read, a
            # digest and a constant-time compare against a stand-in), so how long a check takes
            # does not tell whether an id exists (issue 34: 1.36 vs 1.82 ms before). Unknown ids
            # are not cached: a token made a moment later must work at once.
            loaded = self._load(token_id)
            if loaded is None:
                with self._lock:
                    self._cache.pop(token_id, None)
                loaded = (_STAND_IN, _UNKNOWN)
                hit = (mono, *loaded)
            else:
                hit = (mono + self.cache_s, *loaded)
            if loaded[1] is not _UNKNOWN:
                with self._lock:
                    self._cache[token_id] = hit
        _, digest, info = hit
        if not hmac.compare_digest(digest, _digest(secret)):
            raise AuthError("token is unknown or revoked")
        if info is _UNKNOWN:
            raise AuthError("token is unknown or revoked")
        if info.expired(time.time() if now is None else now):
            raise AuthError("token has expired")
        return Identity(info.user, info.role, token_id)

    def alive(self, token_id: str, now: float | None = None) -> bool:
        """Is the token ``token_id`` still valid (not revoked, not expired)? Read afresh, not
        through the check cache: what ends a revoked token's open streams (frenzy.rpc.limits)."""
        raw = self.r.hmget(self.k.token(token_id), "sha256", "expires_at")
        if not raw or raw[0] is None:
            return False
        try:
            expires = float(raw[1] or 0)
        except (TypeError, ValueError):
            return False
        return not (expires > 0 and (time.time() if now is None else now) >= expires)

    def prune(self, now: float | None = None) -> int:
        """Delete the tokens that expired over ``EXPIRED_KEPT_S`` ago (records made before Redis
        was given their expiry) and forget index entries whose record is gone (Redis expired it).
        Run by ``list`` and every scheduler (hourly). -> the records deleted."""
        now = time.time() if now is None else now
        ids = sorted(i.decode() if isinstance(i, bytes) else i for i in self.r.smembers(self.k.tokens()))
        pipe = self.r.pipeline(transaction=False)
        for token_id in ids:
            pipe.hget(self.k.token(token_id), "expires_at")
        gone, stale = [], []
        for token_id, expires in zip(ids, pipe.execute() if ids else [], strict=True):
            try:
                ended = float(expires or 0)
            except (TypeError, ValueError):
                ended = 0.0
            if expires is None:
                gone.append(token_id)
            elif ended > 0 and ended + EXPIRED_KEPT_S <= now:
                stale.append(token_id)
        if gone or stale:
            pipe = self.r.pipeline(transaction=True)
            for token_id in stale:
                pipe.delete(self.k.token(token_id))
            pipe.srem(self.k.tokens(), *gone, *stale)
            pipe.execute()
        return len(stale)

    def list(self) -> list[TokenInfo]:
        self.prune()
        ids = sorted(i.decode() if isinstance(i, bytes) else i for i in self.r.smembers(self.k.tokens()))
        out = []
        for token_id in ids:
            loaded = self._load(token_id)
            if loaded is not None:
                out.append(loaded[1])
        return sorted(out, key=lambda t: t.created_at)

    def revoke(self, token_id: str) -> bool:
        """Delete a token (by id, or by the whole token); False if there was none."""
        if token_id.startswith(PREFIX):
            token_id, _ = parse_token(token_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(self.k.token(token_id))
        pipe.srem(self.k.tokens(), token_id)
        deleted, _ = pipe.execute()
        with self._lock:
            self._cache.pop(token_id, None)
        return bool(deleted)
