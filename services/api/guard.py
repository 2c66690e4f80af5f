"""The web edge of the REST API: what a browser on another site or a huge body must never get past.

An ASGI middleware, in front of every route, that (issue 14 items 5 and 8):

- checks the Host header against an allowlist (421 otherwise), so a DNS-rebinding page whose
  name now points at 127.0.0.1 cannot talk to the API;
- on mutating requests (POST, PUT, PATCH, DELETE) refuses an Origin that is not allowed (403)
  and any Content-Type but ``application/json`` (415): a cross-site ``text/plain`` or form
  POST is a "simple request" a browser sends without asking, a JSON one is not;
- caps the body (413): a Content-Length over the cap is refused before a byte is read, and
  a streamed (chunked) body is counted as it arrives and refused the moment it passes the cap,
  so at most ``max_body_bytes`` are ever held;
- compares a write's Origin with the allowed names and the request's own port (issue 34: a page
  on ``localhost:9999`` is another origin than the API on ``localhost:8080``);
- adds security headers to every answer (issue 34): ``X-Frame-Options: DENY``,
  ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and a content security
  policy: the page's own (``page_policies``, e.g. the dashboard's inline script by hash),
  Swagger UI's on /docs (its inline start-up script), else nothing at all may load; always
  ``frame-ancestors 'none'``.

Refusals are ``{"detail": "..."}`` like every other error of the API.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# Swagger UI (/docs): its files from this origin, its inline start-up script and styles
DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
API_CSP = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
SECURITY_HEADERS = ((b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"))


def host_name(value: str) -> str:
    """'Example.COM:8080' -> 'example.com'; '[::1]:8080' -> '::1'; '' when unparsable."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else ""
    if value.count(":") > 1:  # a bare IPv6 address
        return value
    return value.split(":", 1)[0].rstrip(".")


def host_port(value: str, scheme: str = "http") -> tuple[str, int]:
    """'Example.COM:8080' -> ('example.com', 8080); no port: the scheme's default."""
    value = value.strip().lower()
    name = host_name(value)
    rest = value[value.find("]") + 1:] if value.startswith("[") else ("" if value.count(":") > 1 else value)
    _, sep, port = rest.rpartition(":") if ":" in rest else ("", "", "")
    try:
        number = int(port) if sep else DEFAULT_PORTS.get(scheme, 80)
    except ValueError:
        number = -1
    return name, number


def allowed_host_names(bind_host: str = "127.0.0.1", extra: Iterable[str] = ()) -> frozenset[str]:
    """localhost, 127.0.0.1 and ::1, the bound address unless it is a wildcard, and ``extra``
    ('*' allows any Host: only behind a proxy that checks it)."""
    names = set(LOOPBACK_HOSTS)
    if bind_host.strip() not in WILDCARD_BINDS:
        names.add(host_name(bind_host) if not bind_host.count(":") > 1 else bind_host.strip("[]").lower())
    for h in extra:
        names.add("*" if h.strip() == "*" else host_name(h))
    names.discard("")
    return frozenset(names)


class GuardRefusal(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class WebGuard:
    """Pure ASGI middleware (a BaseHTTPMiddleware would buffer the body before it could count)."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] = frozenset(LOOPBACK_HOSTS),
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, page_policies: dict[str, str] | None = None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.max_body_bytes = max_body_bytes
        self.page_policies = dict(page_policies or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        send = self._with_headers(scope, send)
        try:
            self._check_headers(scope, headers)
            body = await self._read_body(receive, headers)
        except GuardRefusal as refusal:
            await JSONResponse({"detail": refusal.detail}, status_code=refusal.status)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _with_headers(self, scope: Scope, send: Send) -> Send:
        path = scope.get("path", "")
        policy = self.page_policies.get(path) or (DOCS_CSP if path.startswith("/docs") else API_CSP)
        extra = [*SECURITY_HEADERS, (b"content-security-policy", policy.encode("latin-1"))]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", ())}
                message = {**message, "headers": [*message.get("headers", ()),
                                                  *((k, v) for k, v in extra if k not in names)]}
            await send(message)

        return sending

    def _same_origin(self, origin: str, host: str, scheme: str) -> bool:
        """The Origin names this API as the request reached it: an allowed host name (as the Host
        header must be) on the Host header's port (default ports by scheme)."""
        if "://" not in origin:
            return False
        parts = urlsplit(origin)
        if not self._allowed(parts.netloc):
            return False
        # (a Host without a port: the origin's scheme's default, e.g. behind a TLS proxy)
        return host_port(parts.netloc, parts.scheme)[1] == host_port(host, parts.scheme or scheme)[1]

    def _allowed(self, host: str) -> bool:
        return "*" in self.allowed_hosts or host_name(host) in self.allowed_hosts

    def _check_headers(self, scope: Scope, headers: dict[str, str]) -> None:
        host = headers.get("host", "")
        if not host:
            raise GuardRefusal(400, "missing Host header")
        if not self._allowed(host):
            raise GuardRefusal(421, f"Host {host_name(host)[:100]!r} is not served here. An operator allows more "
                               "names with `frenzy api --allowed-host NAME`")
        if scope.get("method", "GET").upper() not in MUTATING:
            return
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, host, scope.get("scheme", "http")):
            raise GuardRefusal(403, "cross-origin request refused (the Origin is not this API's own: host and port)")
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise GuardRefusal(415, "Content-Type must be application/json (curl: -H 'Content-Type: application/json')")

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> bytes:
        limit = self.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise GuardRefusal(400, "invalid Content-Length")
            if int(declared) > limit:
                raise GuardRefusal(413, f"body of {int(declared)} bytes; the limit is {limit} bytes")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                raise GuardRefusal(400, "client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise GuardRefusal(413, f"body over the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, then the real channel (for disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
