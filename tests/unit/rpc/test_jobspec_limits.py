"""JobEntry's limits (issue 14 items 8, 9 and 10): each names the field and the limit, and the
largest allowed value passes. Before, a 3.9 MB name, 1e23 as global_batch and a server-side
model path were all accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy.rpc.jobspec import (
    MAX_BATCH,
    MAX_COMMAND_ENV_BYTES,
    MAX_MODEL_CONFIG_BYTES,
    MAX_NAME_CHARS,
    MAX_SEQ_LEN,
    JobSpecError,
    parse_entry,
)

GOOD = {"name": "j", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": ["python", "t.py"]}


def error(**over: object) -> str:
    with pytest.raises(JobSpecError) as info:
        parse_entry({**GOOD, **over}).to_proto(read_model_files=False)
    return str(info.value)


def test_name_is_at_most_256_characters() -> None:
    """issue 14 item 8"""
    assert parse_entry({**GOOD, "name": "n" * MAX_NAME_CHARS}).name == "n" * MAX_NAME_CHARS
    msg = error(name="n" * (MAX_NAME_CHARS + 1))
    assert msg.startswith("name:") and "256" in msg


def test_command_plus_env_is_at_most_64_kib() -> None:
    """issue 14 item 8"""
    half = MAX_COMMAND_ENV_BYTES // 2
    parse_entry({**GOOD, "command": ["a" * (half - 1)], "env": {"K": "v" * (half - 10)}})
    msg = error(command=["a" * half], env={"K": "v" * half})
    assert msg.startswith("env:") and "65536" in msg
    assert error(command=["a" * MAX_COMMAND_ENV_BYTES]).startswith("command:")
    assert error(command="a" * (MAX_COMMAND_ENV_BYTES + 1)).startswith("command:")


@pytest.mark.parametrize("key", ["", "1A", "A B", "A=B", "A\x00", "A-B", "K" * 300])
def test_env_keys_are_shell_names(key: str) -> None:
    """issue 14 item 8"""
    assert error(env={key: "1"}).startswith("env")


def test_inline_model_config_is_at_most_1_mib_and_a_shallow_object() -> None:
    """issue 14 items 8 and 10"""
    config = {"architectures": ["LlamaForCausalLM"], "pad": "x" * (MAX_MODEL_CONFIG_BYTES - 100)}
    spec = parse_entry({**GOOD, "model": config}).to_proto(read_model_files=False)
    assert json.loads(spec.model.config_json) == config
    config["pad"] += "x" * 200
    for model in (config, json.dumps(config)):
        msg = error(model=model)
        assert msg.startswith("model:") and "1 MiB" in msg
    assert "nested deeper" in error(model={"a": json.loads("[" * 100 + "]" * 100)})
    assert "nested deeper" in error(model='{"a": ' + "[" * 5000 + "]" * 5000 + "}")
    assert "not valid JSON" in error(model="{nope")


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [("global_batch", 1e23, MAX_BATCH), ("global_batch", MAX_BATCH + 1, MAX_BATCH), ("seq_len", 10**30, MAX_SEQ_LEN),
     ("seq_len", float("inf"), MAX_SEQ_LEN), ("micro_batch", 1 << 40, MAX_BATCH), ("train_steps", 10**20, None),
     ("max_gpus", 2**31, None)],
)
def test_numbers_out_of_range_name_the_field(field: str, value: object, limit: int | None) -> None:
    """issue 14 item 10: 1e23 as global_batch was a 500 (the proto's int64 overflowed)."""
    msg = error(**{field: value})
    assert msg.startswith(field + ":"), msg
    if limit is not None:
        assert str(limit) in msg


def test_micro_batch_times_seq_len_is_bounded() -> None:
    """issue 14 item 10: a huge seq_len x micro_batch overflowed the predictor's byte counts."""
    parse_entry({**GOOD, "seq_len": MAX_SEQ_LEN, "global_batch": 16, "micro_batch": 16})
    assert error(seq_len=MAX_SEQ_LEN, micro_batch=MAX_BATCH).startswith("micro_batch:")


def test_a_server_never_opens_a_model_path(tmp_path: Path) -> None:
    """issue 14 item 9: the same answer whether the file exists or not; the CLI still reads it."""
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"secret_key": 1}))
    answers = {error(model=str(config)), error(model=str(tmp_path / "missing.json")), error(model="/etc/shadow")}
    assert len(answers) == 1 and "secret_key" not in answers.pop()
    spec = parse_entry({**GOOD, "model": str(config)}).to_proto()  # the CLI: read on the client
    assert json.loads(spec.model.config_json) == {"secret_key": 1} and spec.model.display_name == "tiny"
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"pad": "x" * MAX_MODEL_CONFIG_BYTES}))
    with pytest.raises(JobSpecError, match="1 MiB"):
        parse_entry({**GOOD, "model": str(big)}).to_proto()


def test_min_gpus_travels_and_is_checked() -> None:
    spec = parse_entry({**GOOD, "min_gpus": 4, "max_gpus": 4}).to_proto(read_model_files=False)
    assert spec.limits.min_gpus == 4 and spec.limits.max_gpus == 4
    assert "min_gpus" in error(min_gpus=-1)
