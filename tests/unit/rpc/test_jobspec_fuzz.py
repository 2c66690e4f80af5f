"""Property-based fuzzing of JobEntry, the one validator behind the CLI, REST, batch and worker
paths (issue 14 items 7, 8 and 10): any JSON-like input ends in a JobSpec proto or a JobSpecError
naming a field, quickly; never another exception, never an overflowing number."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzy.rpc.jobspec import (
    MAX_COMMAND_ENV_BYTES,
    MAX_NAME_CHARS,
    JobEntry,
    JobSpecError,
    parse_entry,
)

SETTINGS = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)
FIELDS = list(JobEntry.model_fields)

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats() | st.text(max_size=30) | st.sampled_from(["gpt2-124m", "/etc/passwd", "{", "{}", "1e23",
                                                                    "\x00", "\ud800", "a b", "../x.json"]))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
# Mostly well-formed entries with one or more fields replaced by anything.
base = {"name": "j", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "python train.py"}
entries = st.builds(lambda over: {**base, **over},
                    st.dictionaries(st.sampled_from([*FIELDS, "gpus", ""]), json_values, max_size=4))


def _check(data: object) -> None:
    try:
        entry = parse_entry(data)
    except JobSpecError as exc:
        assert str(exc).split(":", 1)[0], exc  # names a field (or <job>)
        return
    for read_files in (False, True):
        try:
            spec = entry.to_proto(read_model_files=read_files)
        except JobSpecError:
            continue
        assert len(spec.name) <= MAX_NAME_CHARS
        assert sum(len(a.encode()) + 1 for a in spec.command) <= MAX_COMMAND_ENV_BYTES
        assert spec.SerializeToString()


@SETTINGS
@given(json_values)
def test_anything_is_a_spec_or_a_job_spec_error(data: object) -> None:
    _check(data)


@SETTINGS
@given(entries)
def test_entries_with_bad_fields(data: dict) -> None:
    _check(data)


@settings(max_examples=100, deadline=2000, derandomize=True)
@given(st.integers(min_value=1, max_value=200), st.sampled_from(["[", "{\"a\":"]))
def test_deep_inline_model_configs(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    text = "{\"m\": " + opener * depth + "1" + closer * depth + "}"
    _check({**base, "model": text})
    _check({**base, "model": json.loads(text)})
