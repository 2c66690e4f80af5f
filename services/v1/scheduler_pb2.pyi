from frenzy.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "duplicate")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    duplicate: bool
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "limit", "user", "name", "since")
    STATES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.JobState]
    limit: int
    user: str
    name: str
    since: float
    def __init__(self, states: _Optional[_Iterable[_Union[_types_pb2.JobState, str]]] = ..., limit: _Optional[int] = ..., user: _Optional[str] = ..., name: _Optional[str] = ..., since: _Optional[float] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "all_users")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ALL_USERS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    all_users: bool
    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]] = ..., all_users: _Optional[bool] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobUpdate(_message.Message):
    __slots__ = ("job", "transition")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    transition: _types_pb2.StateTransition
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., transition: _Optional[_Union[_types_pb2.StateTransition, _Mapping]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("include_dead",)
    INCLUDE_DEAD_FIELD_NUMBER: _ClassVar[int]
    include_dead: bool
    def __init__(self, include_dead: _Optional[bool] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[_types_pb2.Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[_types_pb2.Node, _Mapping]]] = ...) -> None: ...

class StreamLogsRequest(_message.Message):
    __slots__ = ("job_id", "follow", "node", "attempt", "tail_lines")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    follow: bool
    node: str
    attempt: int
    tail_lines: int
    def __init__(self, job_id: _Optional[str] = ..., follow: _Optional[bool] = ..., node: _Optional[str] = ..., attempt: _Optional[int] = ..., tail_lines: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("node", "attempt", "offset", "text", "at")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    node: str
    attempt: int
    offset: int
    text: str
    at: float
    def __init__(self, node: _Optional[str] = ..., attempt: _Optional[int] = ..., offset: _Optional[int] = ..., text: _Optional[str] = ..., at: _Optional[float] = ...) -> None: ...

class HasCodeRequest(_message.Message):
    __slots__ = ("sha256",)
    SHA256_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    def __init__(self, sha256: _Optional[str] = ...) -> None: ...

class HasCodeResponse(_message.Message):
    __slots__ = ("present", "size", "max_bytes")
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    present: bool
    size: int
    max_bytes: int
    def __init__(self, present: _Optional[bool] = ..., size: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class CodeChunk(_message.Message):
    __slots__ = ("sha256", "size", "data")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size: int
    data: bytes
    def __init__(self, sha256: _Optional[str] = ..., size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CodeRef(_message.Message):
    __slots__ = ("sha256", "size", "existed")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size: int
    existed: bool
    def __init__(self, sha256: _Optional[str] = ..., size: _Optional[int] = ..., existed: _Optional[bool] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("user", "since", "by", "until")
    USER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    user: str
    since: float
    by: _containers.RepeatedScalarFieldContainer[str]
    until: float
    def __init__(self, user: _Optional[str] = ..., since: _Optional[float] = ..., by: _Optional[_Iterable[str]] = ..., until: _Optional[float] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("user", "gpu_type", "day", "job", "gpu_hours", "cost_usd", "attempts")
    USER_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    DAY_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    user: str
    gpu_type: str
    day: str
    job: str
    gpu_hours: float
    cost_usd: float
    attempts: int
    def __init__(self, user: _Optional[str] = ..., gpu_type: _Optional[str] = ..., day: _Optional[str] = ..., job: _Optional[str] = ..., gpu_hours: _Optional[float] = ..., cost_usd: _Optional[float] = ..., attempts: _Optional[int] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("rows", "all_users", "since", "until", "by")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ALL_USERS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    all_users: bool
    since: float
    until: float
    by: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., all_users: _Optional[bool] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., by: _Optional[_Iterable[str]] = ...) -> None: ...
