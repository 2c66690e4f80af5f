"""Send packed code to the scheduler, unless it already holds that tree (one path for the CLI and the SDK).

``HasCode`` first: a tree the scheduler already holds (the same sha256) is not sent again,
only given a longer life. Otherwise ``UploadCode`` streams it in 1 MiB chunks; the first says
the sha256 and size the scheduler checks the whole upload against.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from frenzy.code.limits import CHUNK_BYTES, MiB
from frenzy.code.pack import CodeTooLarge, PackedCode
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc


@dataclass(frozen=True)
class Uploaded:
    sha256: str
    size: int
    sent: bool  # False: the scheduler already held it


def chunks(packed: PackedCode, chunk_bytes: int = CHUNK_BYTES) -> Iterator[scheduler_pb2.CodeChunk]:
    data = packed.data
    for start in range(0, len(data), chunk_bytes):
        piece = data[start:start + chunk_bytes]
        if start == 0:
            yield scheduler_pb2.CodeChunk(sha256=packed.sha256, size=len(data), data=piece)
        else:
            yield scheduler_pb2.CodeChunk(data=piece)


def upload_timeout_s(size: int) -> float:
    """A deadline for sending ``size`` bytes: a minute, plus 10 s a MiB (a slow link, 100 KiB/s)."""
    return 60.0 + 10.0 * size / MiB


def ensure_uploaded(stub: scheduler_pb2_grpc.SchedulerStub, packed: PackedCode) -> Uploaded:
    """Make sure the scheduler holds ``packed``. Raises grpc.RpcError, or CodeTooLarge when the
    scheduler's own limit (which may be below the client's) is exceeded."""
    have = stub.HasCode(scheduler_pb2.HasCodeRequest(sha256=packed.sha256), timeout=30)
    if have.present:
        return Uploaded(packed.sha256, packed.size, sent=False)
    if have.max_bytes and packed.size > have.max_bytes:
        raise CodeTooLarge(f"code: the packed directory is {packed.size / MiB:.1f} MiB; the scheduler takes at most "
                           f"{have.max_bytes / MiB:.0f} MiB. To fix: leave big files out (.gitignore), or keep "
                           "them on a shared filesystem and submit with --workdir")
    ref = stub.UploadCode(chunks(packed), timeout=upload_timeout_s(packed.size))
    return Uploaded(ref.sha256, ref.size, sent=not ref.existed)
