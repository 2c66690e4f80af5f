"""Property-based fuzzing of the batch-file parser (issue 14 items 7 and 11): whatever the
file holds, reading it ends in entries or a BatchFileError, quickly; never another exception."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzy.worker.batch import BatchFileError, load_batch_file, load_yaml, parse_batch

SETTINGS = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)

# Pieces YAML gives meaning to, so random text reaches the composer and constructor, not only the scanner.
YAML_TOKENS = st.sampled_from([
    "jobs:", "defaults:", "\n", "  ", "- ", ": ", "&a ", "*a", "&b ", "*b", "<<: *a", "[", "]", "{", "}", ", ",
    "!!set ", "!!binary ", "!!timestamp ", "!!python/object:os.system ", "2024-01-01", "1e999", "0x1f", "~",
    "name", "model", "gpt2-124m", "2024-01-01: x", "? !!binary aGk= : 1", "command", "env", "? ", "|\n", "'", '"', "\t", "\\x1b", "---\n", "...\n", "%YAML 1.1\n",
])
yaml_text = st.one_of(st.text(max_size=300), st.lists(YAML_TOKENS, max_size=60).map("".join))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


def _check(entries: list) -> None:
    assert entries and all(isinstance(e, dict) for e in entries)
    json.dumps(entries)  # what crosses the queue


@SETTINGS
@given(yaml_text)
def test_any_text_is_entries_or_a_batch_file_error(text: str) -> None:
    try:
        _check(parse_batch(load_yaml(text)))
    except BatchFileError:
        pass


@SETTINGS
@given(json_values)
def test_any_document_shape_is_entries_or_a_batch_file_error(data: object) -> None:
    for doc in (data, {"jobs": data}, {"jobs": [data]}, {"defaults": data, "jobs": [{"name": "a"}]}):
        try:
            _check(parse_batch(doc))
        except BatchFileError:
            pass


@settings(max_examples=60, deadline=3000, derandomize=True)
@given(st.binary(max_size=400))
def test_any_bytes_on_disk(raw: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "b.yaml"
        path.write_bytes(raw)
        try:
            _check(load_batch_file(path))
        except BatchFileError:
            pass
