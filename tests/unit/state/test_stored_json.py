"""``stored_json.message_from_dict`` reads stored JSON exactly as ``json_format.ParseDict`` does.

Random messages of every type the job hash stores (JobSpec, Plan, Job) are filled through their
descriptors -- nested messages, repeated fields, maps, enums, 64-bit integers, NaN and infinities,
proto3 ``optional`` -- written with ``MessageToDict`` (camelCase, and original names) and read
back by both readers; the results must be equal. Input json_format refuses is refused the same way.
"""

from __future__ import annotations

import math
import random

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from frenzy.state import stored_json
from frenzy.state.stored_json import message_from_dict
from frenzy.v1 import types_pb2

F = FieldDescriptor


def _scalar(f: FieldDescriptor, rnd: random.Random) -> object:
    if f.type == F.TYPE_ENUM:
        return rnd.choice(f.enum_type.values).number
    if f.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return rnd.choice([0.0, 1.5, -2.25, 1e300 if f.type == F.TYPE_DOUBLE else 3.5, math.inf, -math.inf,
                           rnd.random()])
    if f.type == F.TYPE_BOOL:
        return rnd.random() < 0.5
    if f.type == F.TYPE_STRING:
        return rnd.choice(["", "a", "gpt2-124m", "Ünïcode ✓", '{"json": "inside"}'])
    if f.type == F.TYPE_BYTES:
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(6)))
    big = 2**62 if f.type in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64, F.TYPE_UINT64, F.TYPE_FIXED64) else 2**30
    low = 0 if f.type in (F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FIXED32, F.TYPE_FIXED64) else -big
    return rnd.randrange(low, big)


def _fill(msg: Message, rnd: random.Random, depth: int = 0) -> Message:
    desc: Descriptor = msg.DESCRIPTOR
    for f in desc.fields:
        if rnd.random() < 0.3:
            continue  # left unset
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value_f = f.message_type.fields_by_name["value"]
            target = getattr(msg, f.name)
            for i in range(rnd.randrange(3)):
                if value_f.message_type is not None:
                    _fill(target[f"k{i}"], rnd, depth + 1)
                else:
                    target[f"k{i}"] = _scalar(value_f, rnd)
        elif f.is_repeated:
            target = getattr(msg, f.name)
            for _ in range(rnd.randrange(3)):
                if f.message_type is not None:
                    if depth < 3:
                        _fill(target.add(), rnd, depth + 1)
                else:
                    target.append(_scalar(f, rnd))
        elif f.message_type is not None:
            if depth < 3:
                _fill(getattr(msg, f.name), rnd, depth + 1)
        else:
            setattr(msg, f.name, _scalar(f, rnd))
    return msg


@pytest.mark.parametrize("cls", [types_pb2.JobSpec, types_pb2.Plan, types_pb2.Job], ids=lambda c: c.__name__)
@pytest.mark.parametrize("original_names", [False, True], ids=["camelCase", "original-names"])
def test_random_messages_read_back_as_json_format_reads_them(cls: type[Message], original_names: bool) -> None:
    rnd = random.Random(f"{cls.__name__}/{original_names}")
    for _ in range(150):
        msg = _fill(cls(), rnd)
        data = json_format.MessageToDict(msg, preserving_proto_field_name=original_names)
        stored_json._kwargs(data, cls.DESCRIPTOR)  # the fast path takes it (no quiet fallback)
        ours, theirs = message_from_dict(data, cls), json_format.ParseDict(data, cls())
        assert ours == theirs
        assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)


def test_presence_and_nan_survive() -> None:
    spec = types_pb2.JobSpec(name="j", max_oom_retries=0)
    back = message_from_dict(json_format.MessageToDict(spec), types_pb2.JobSpec)
    assert back.HasField("max_oom_retries") and back.max_oom_retries == 0
    assert not message_from_dict({"name": "j"}, types_pb2.JobSpec).HasField("max_oom_retries")
    plan = message_from_dict({"stepTimeS": "NaN", "peakBytesPerGpu": "123", "layout": {"tp": 2}}, types_pb2.Plan)
    assert math.isnan(plan.step_time_s) and plan.peak_bytes_per_gpu == 123 and plan.layout.tp == 2


@pytest.mark.parametrize("bad", [
    {"noSuchField": 1},
    {"numGpus": "four"},
    {"numGpus": 1.5},
    {"layout": [1, 2]},
    {"gpuType": 7},
    {"stepTimeS": "fast"},
])
def test_what_json_format_refuses_is_refused_with_its_error(bad: dict) -> None:
    with pytest.raises(json_format.ParseError):
        json_format.ParseDict(bad, types_pb2.Plan())
    with pytest.raises(json_format.ParseError):
        message_from_dict(bad, types_pb2.Plan)
