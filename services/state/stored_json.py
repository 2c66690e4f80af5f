"""Messages from the JSON the job hash stores, at the speed of protobuf's C constructor.

The job hash keeps its spec and plans as proto3 JSON (``json_format.MessageToDict``: readable
with ``redis-cli``, and the format every stored job already has). ``json_format.ParseDict`` reads
it back in pure Python, about 80 us a plan: the scheduler's events and reaper read jobs all the
time (issue 15). This reads the same mapping -- camelCase or original field names, 64-bit
integers as strings, enums by name or number, NaN and Infinity as strings, nested messages,
repeated fields and maps of scalars -- by building keyword arguments for the message's
constructor. Anything else (bytes, well-known types, maps of messages, a name it does not know)
goes to ``json_format``, which also gives the error for a malformed value.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)

_INTS = frozenset({
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
})
_FLOATS = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class _Unsupported(Exception):
    """A value this reader leaves to json_format."""


def message_from_dict(data: dict[str, Any], cls: type[M]) -> M:
    """``json_format.ParseDict(data, cls())``, built in one constructor call where it can be."""
    try:
        return cls(**_kwargs(data, cls.DESCRIPTOR))
    except (_Unsupported, TypeError, ValueError, KeyError, AttributeError):
        return json_format.ParseDict(data, cls())


def _kwargs(data: dict[str, Any], desc: Descriptor) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _Unsupported
    out: dict[str, Any] = {}
    for key, value in data.items():
        f = desc.fields_by_camelcase_name.get(key) or desc.fields_by_name.get(key)
        if f is None:
            raise _Unsupported  # json_format says which name it does not know
        if value is None:
            continue  # JSON null: the field's default
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            if not isinstance(value, dict):
                raise _Unsupported
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            if key_f.type != FieldDescriptor.TYPE_STRING or value_f.message_type is not None:
                raise _Unsupported
            out[f.name] = {k: _scalar(value_f, v) for k, v in value.items()}
        elif f.is_repeated:
            if not isinstance(value, list):
                raise _Unsupported
            out[f.name] = [_value(f, v) for v in value]
        else:
            out[f.name] = _value(f, value)
    return out


def _value(f: FieldDescriptor, value: Any) -> Any:
    if f.message_type is not None:
        if f.message_type.full_name.startswith("google.protobuf."):
            raise _Unsupported  # well-known types have JSON forms of their own
        return _kwargs(value, f.message_type)  # the constructor takes a dict for a message field
    return _scalar(f, value)


def _scalar(f: FieldDescriptor, value: Any) -> Any:
    if f.type in _INTS:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise _Unsupported
        return int(value)
    if f.type in _FLOATS:
        if isinstance(value, str):
            return _SPECIAL_FLOATS[value]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Unsupported
        return float(value)
    if f.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise _Unsupported
        return value
    if f.type == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            raise _Unsupported
        return value
    if f.type == FieldDescriptor.TYPE_ENUM:
        if isinstance(value, str):
            return f.enum_type.values_by_name[value].number
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Unsupported
        return value
    raise _Unsupported  # bytes (base64) and anything newer
