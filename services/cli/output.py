"""Helpers every `frenzy` command shares: options, exit codes, error output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, NoReturn

import grpc
import typer

from frenzy.cli import render
from frenzy.rpc.client import scheduler_stub
from frenzy.v1 import scheduler_pb2_grpc

if TYPE_CHECKING:  # redis is the server side's (the `server` extra): imported where an operator command runs
    import redis

SchedulerOpt = Annotated[str, typer.Option("--scheduler", envvar="FRENZY_SCHEDULER",
                                           help="Scheduler gRPC address [default: the credentials file's, else 127.0.0.1:50051].",
                                           show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
# A server's TLS: serve with --tls-cert/--tls-key; --tls-ca also requires client certificates.
TlsCertOpt = Annotated[str | None, typer.Option("--tls-cert", envvar="FRENZY_TLS_SERVER_CERT",
                                                help="Serve TLS with this certificate (PEM; `frenzy certs create`).")]
TlsKeyOpt = Annotated[str | None, typer.Option("--tls-key", envvar="FRENZY_TLS_SERVER_KEY",
                                               help="The certificate's private key (PEM).")]
TlsCaOpt = Annotated[str | None, typer.Option("--tls-ca", envvar="FRENZY_TLS_CLIENT_CA",
                                              help="Require client certificates signed by this CA (mutual TLS).")]

EXIT_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: 2,
    grpc.StatusCode.FAILED_PRECONDITION: 3,
    grpc.StatusCode.NOT_FOUND: 4,
}
# `cancel` of a job that already SUCCEEDED or FAILED: not "the cluster cannot hold the job" (3);
# the caller asked to stop work that had ended some other way, which a script may want to know.
EXIT_ALREADY_ENDED = 5


def fail(message: str, code: int = 1) -> NoReturn:
    render.console(stderr=True).print(f"[red]error:[/] {message}")
    raise typer.Exit(code)


def rpc_fail(exc: grpc.RpcError) -> NoReturn:
    # One text for a failed call, here and in the SDK's exceptions (frenzy.sdk.errors).
    from frenzy.sdk.errors import describe

    code = exc.code()
    fail(describe(code, exc.details()), EXIT_BY_CODE.get(code, 1))


def echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))




@contextmanager
def scheduler_call(address: str) -> Iterator[scheduler_pb2_grpc.SchedulerStub]:
    """A scheduler stub whose gRPC errors end the command the one way every command
    reports them (status name, details, a "To fix" where we know one, exit code)."""
    try:
        with scheduler_stub(address) as stub:
            yield stub
    except grpc.RpcError as exc:
        rpc_fail(exc)


# ---- operator commands on the cluster's Redis (frenzy token, frenzy node) -----------------------

RedisOpt = Annotated[str, typer.Option(
    "--redis-url", envvar="REDIS_URL", show_default=False,
    help="The cluster's Redis, with the operator's credentials [default: the credentials file's, which `frenzy up` "
         "writes for its own Redis].")]
PrefixOpt = Annotated[str, typer.Option(envvar="FRENZY_PREFIX", help="Redis key prefix.")]


def stack_redis_url(explicit: str, field: str, missing: str) -> str:
    """``explicit`` (--redis-url, REDIS_URL), else the credentials file's ``field`` (`frenzy up` writes
    its stack's), else the command ends with ``missing``, a "To fix". No guess at 127.0.0.1:6379,
    which may be another program's Redis."""
    from frenzy.auth.credentials import CredentialsError, credentials_path, read_credentials

    if explicit:
        return explicit
    try:
        found = getattr(read_credentials(), field)
    except CredentialsError as exc:
        fail(str(exc), 1)
    if not found:
        fail(f"{missing.format(credentials=credentials_path())}", 1)
    return found


def operator_redis_url(redis_url: str) -> str:
    """The Redis an operator command manages: the operator's (the credentials file's ``redis``)."""
    return stack_redis_url(redis_url, "redis", (
        "no Redis to manage: --redis-url and REDIS_URL are unset and {credentials} names none. To fix: set "
        "REDIS_URL to the cluster's Redis with the operator's credentials (redis://USER:PASSWORD@HOST:PORT/0), "
        "or run `frenzy up`, which writes its own there"))


def operator_redis(redis_url: str) -> redis.Redis:
    """A client on the cluster's Redis for an operator command (decoded replies, a bounded wait)."""
    import redis

    return redis.Redis.from_url(operator_redis_url(redis_url), decode_responses=True, socket_timeout=10)


def redis_errors(fn):  # noqa: ANN001, ANN202
    """``fn`` with Redis' refusals and absence ending the command as a clear error (exit 1)."""
    def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        import redis

        try:
            return fn(*args, **kwargs)
        except redis.AuthenticationError:
            fail("Redis refused the credentials in --redis-url / REDIS_URL", 1)
        except redis.ConnectionError:
            fail("cannot reach Redis at --redis-url / REDIS_URL. To fix: point it at the cluster's Redis", 1)
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    wrapped.__wrapped__ = fn
    return wrapped
