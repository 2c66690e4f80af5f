from frenzy.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PredictRequest(_message.Message):
    __slots__ = ("model", "recipe", "limits", "pools", "safety_margin", "max_plans", "mixed", "goal")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_MARGIN_FIELD_NUMBER: _ClassVar[int]
    MAX_PLANS_FIELD_NUMBER: _ClassVar[int]
    MIXED_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    model: _types_pb2.ModelSpec
    recipe: _types_pb2.TrainingRecipe
    limits: _types_pb2.JobLimits
    pools: _containers.RepeatedCompositeFieldContainer[_types_pb2.GpuPool]
    safety_margin: float
    max_plans: int
    mixed: bool
    goal: _types_pb2.JobGoal
    def __init__(self, model: _Optional[_Union[_types_pb2.ModelSpec, _Mapping]] = ..., recipe: _Optional[_Union[_types_pb2.TrainingRecipe, _Mapping]] = ..., limits: _Optional[_Union[_types_pb2.JobLimits, _Mapping]] = ..., pools: _Optional[_Iterable[_Union[_types_pb2.GpuPool, _Mapping]]] = ..., safety_margin: _Optional[float] = ..., max_plans: _Optional[int] = ..., mixed: _Optional[bool] = ..., goal: _Optional[_Union[_types_pb2.JobGoal, _Mapping]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("plans", "rejected", "model_name", "parameter_count", "dropped")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_COUNT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[_types_pb2.Plan]
    rejected: _containers.RepeatedScalarFieldContainer[str]
    model_name: str
    parameter_count: int
    dropped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, plans: _Optional[_Iterable[_Union[_types_pb2.Plan, _Mapping]]] = ..., rejected: _Optional[_Iterable[str]] = ..., model_name: _Optional[str] = ..., parameter_count: _Optional[int] = ..., dropped: _Optional[_Iterable[str]] = ...) -> None: ...
