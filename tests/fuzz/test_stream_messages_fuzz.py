"""Property-based fuzzing of the stream message decoders (issue 14): whatever a Redis stream entry
holds (no ``data`` field, bytes that are not UTF-8, text that is not JSON, JSON that is not an
object, an object with junk in any field), decoding it ends in a message or a BadMessage, quickly;
never another exception, so a garbage entry never stops a consumer.

The agent and the scheduler read an entry in steps (the JSON object, its seal, then the message);
the seal check answers a refusal or nothing. Entries sealed with the right key carry junk past the
seal to the validators, as a compromised signer could."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from frenzy.state.messages import (
    AgentEvent,
    BadMessage,
    CancelMessage,
    LaunchMessage,
    LayoutEnv,
    LogChunk,
    command_from,
    decode_log_chunk,
    event_from,
    payload,
)
from frenzy.state.signing import KeyRing, Refusal, Verifier, seal, signature

SETTINGS = settings(max_examples=250, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)
KEY = b"k" * 32
RING = KeyRing(current=KEY)

LAYOUT = LayoutEnv(gpu_type="A100-80GB", tp=1, pp=1, dp=2, zero_stage=1, micro_batch=4, grad_accum=2)
VALID = [
    LaunchMessage(job_id="job-0123456789ab", attempt=1, fence=7, node="a100-0", node_rank=0, nnodes=1,
                  nproc_per_node=2, gpu_indices=[0, 1], gpu_uuids=["GPU-0", "GPU-1"], master_addr="10.0.0.1",
                  master_port=29500, rdzv_id="job-0123456789ab-1", command=["python", "train.py"],
                  env={"A": "1"}, workdir="/tmp", layout=LAYOUT).model_dump(mode="json"),
    CancelMessage(job_id="job-0123456789ab", attempt=2, reason="user").model_dump(mode="json"),
    AgentEvent(kind="exited", job_id="job-0123456789ab", attempt=1, node="a100-0", fence=7, exit_code=0,
               at=1.0).model_dump(mode="json"),
    LogChunk(node="a100-0", attempt=1, offset=0, text="hello\n", at=1.0).model_dump(mode="json"),
]

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats() | st.text(max_size=20)
           | st.sampled_from([0, -1, 2**63, 2**64, 10**400, math.nan, math.inf, -math.inf, "", "launch", "cancel",
                              "running", "exited", "launch_failed", "../../x", "job-0123456789ab", "\x00",
                              "\ud800", "a" * 200]))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)


@st.composite
def near_valid(draw: st.DrawFn) -> dict:
    """A real message with a few fields replaced by junk, removed, or added."""
    msg = dict(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "delete":
            msg.pop(draw(st.sampled_from(list(msg))), None)
        elif action == "add":
            msg[draw(st.text(max_size=8))] = draw(json_values)
        else:
            msg[draw(st.sampled_from(list(msg)))] = draw(json_values)
    return msg


def _json_text(value: object) -> str:
    return json.dumps(value)  # NaN and Infinity as JSON's non-standard tokens, as Python writes them


data_values = st.one_of(
    st.text(max_size=200), st.binary(max_size=200), st.integers(), st.none(),
    st.builds(_json_text, json_values), st.builds(_json_text, near_valid()),
    st.builds(lambda v: _json_text(v).encode(), near_valid()),
)
entries = st.one_of(
    st.builds(lambda v: {"data": v}, data_values),
    st.builds(lambda v: {b"data": v}, data_values),
    st.dictionaries(st.one_of(st.text(max_size=8), st.binary(max_size=8)), data_values, max_size=3),
)
def _command(fields: dict) -> object:
    return command_from(payload(fields))  # what the agent reads a launch-stream entry with


def _event(fields: dict) -> object:
    return event_from(payload(fields))  # what the scheduler reads an events-stream entry with


DECODERS = (_command, _event, decode_log_chunk)
KINDS = (LaunchMessage, CancelMessage, AgentEvent, LogChunk)


def _decodes(fn, *args) -> None:  # noqa: ANN001 - any of the decoders
    try:
        out = fn(*args)
    except BadMessage as exc:
        assert str(exc)
        return
    assert isinstance(out, dict) if fn is payload else isinstance(out, KINDS)
    if not isinstance(out, dict):
        json.loads(out.model_dump_json())  # re-encodes: what the consumer writes on


@SETTINGS
@given(entries)
@example({"data": b"\xff\xfe"})
@example({"data": '{"kind": "started", "job_id": "j", "node": "\\ud800"}'})  # a lone surrogate: not storable text
@example({"data": "\ud800"})
@example({"data": "[" * 100_000})  # json.loads' RecursionError
@example({"data": '{"kind": "launch", "layout": ' + "[" * 100_000 + "]" * 100_000 + "}"})
@example({})
def test_any_entry_decodes_or_is_a_bad_message(fields: dict) -> None:
    for fn in (*DECODERS, payload):
        _decodes(fn, fields)


@SETTINGS
@given(st.one_of(near_valid(), json_values))
def test_any_object_validates_or_is_a_bad_message(obj: object) -> None:
    if isinstance(obj, dict):
        _decodes(command_from, obj)
        _decodes(event_from, obj)


@SETTINGS
@given(st.one_of(near_valid(), st.dictionaries(st.text(max_size=8), json_values, max_size=5)),
       st.booleans(), st.sampled_from(["1700000000000-0", "0-0", "99999999999999999-1", "x", ""]))
@example({"kind": "launch", "expires_at": 10**400}, True, "1700000000000-0")  # float() of it overflows
def test_the_readers_steps(obj: dict, sign: bool, entry_id: str) -> None:
    """payload, then the seal (the right key or none), then the message: as the agent and the scheduler do."""
    if sign:
        try:
            obj = seal(obj, KEY, now=1_700_000_000.0, ttl_s=120.0)
        except (TypeError, ValueError):
            return  # NaN cannot be signed (canonical JSON has no NaN): no such entry can be sealed
    fields = {"data": json.dumps(obj)}
    try:
        got = payload(fields)
    except BadMessage:
        return
    refusal = Verifier().check(got, RING, entry_id) if entry_id[:1].isdigit() else Refusal.FORGED
    assert refusal is None or isinstance(refusal, Refusal)
    if refusal is None:
        _decodes(command_from, got)
        _decodes(event_from, got)


@SETTINGS
@given(st.sampled_from(VALID), json_values, json_values)
def test_junk_seal_fields_under_a_good_signature(msg: dict, nonce: object, expires_at: object) -> None:
    """A nonce and an expiry of any JSON shape, signed with the right key: a refusal, a BadMessage or a
    message, never another exception."""
    obj = {**msg, "nonce": nonce, "expires_at": expires_at}
    try:
        obj["sig"] = signature(obj, KEY)
    except (TypeError, ValueError):
        return  # NaN cannot be signed
    try:
        got = payload({"data": json.dumps(obj)})
    except BadMessage:
        return  # (a lone surrogate in the junk: not text a writer can store, refused before the seal)
    refusal = Verifier().check(got, RING, "1700000000000-0")
    assert refusal is None or isinstance(refusal, Refusal)
    if refusal is None:
        _decodes(command_from, got)
        _decodes(event_from, got)


def test_a_signed_expiry_too_large_for_a_float() -> None:
    """Found by the fuzzing: float() of an int past any float raised OverflowError in the verifier."""
    test_junk_seal_fields_under_a_good_signature.hypothesis.inner_test(VALID[0], "n", 10**400)
