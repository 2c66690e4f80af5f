"""Protobuf messages as plain JSON-ready dicts, one dialect for every output.

The CLI's ``--json`` and the HTTP gateway both print messages this way: field
names as in the .proto, every field present (unset sub-messages as null),
enums by their short name ("PENDING", not "JOB_STATE_PENDING") and 64-bit
integers as numbers (protobuf's own JSON mapping writes them as strings,
which scripts trip over).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


@cache
def _enum_prefix(enum: EnumDescriptor) -> str:
    """JobState -> "JOB_STATE_": the part every value name repeats."""
    out = []
    for i, ch in enumerate(enum.name):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.upper())
    return "".join(out) + "_"


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        name = field.enum_type.values_by_number[value].name if value in field.enum_type.values_by_number else value
        return name.removeprefix(_enum_prefix(field.enum_type)) if isinstance(name, str) else name
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_json(value)
    if field.type in _INT64:
        return int(value)
    return value


def to_json(msg: Message) -> dict[str, Any]:
    """Every field of ``msg`` by its proto name (unset sub-messages and oneof members: null / absent)."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar(vfield, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v) for v in value]
        elif field.has_presence and not msg.HasField(field.name):
            oneof = field.containing_oneof
            if oneof is not None and len(oneof.fields) > 1:
                continue  # a real oneof: only the member that is set appears
            out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    return out


