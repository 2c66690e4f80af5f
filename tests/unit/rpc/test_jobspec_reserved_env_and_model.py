"""The job entry refuses an env that sets what Frenzy sets for every job (issue 30), from the
agent's own list, on both the pydantic model (CLI, REST, SDK, batch) and the JobSpec a gRPC
client sends; and ``unknown_model`` names a model no catalog or config describes, before a
client packs and uploads anything."""

from __future__ import annotations

import pytest

from frenzy.agent import jobenv
from frenzy.rpc.jobspec import JobSpecError, parse_entry, unknown_model
from frenzy.rpc.spec_limits import check_spec

GOOD = {"name": "j", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": ["python", "t.py"]}


def _refusal(env: dict[str, str]) -> str:
    with pytest.raises(JobSpecError) as info:
        parse_entry({**GOOD, "env": env})
    return str(info.value)


@pytest.mark.parametrize("name", sorted(jobenv.RESERVED) + ["FRENZY_TP", "FRENZY_CHECKPOINT_DIR", "PET_NNODES"])
def test_every_name_the_agent_reserves_is_refused_at_submission(name: str) -> None:
    msg = _refusal({"WANDB_PROJECT": "x", name: "1"})
    assert msg.startswith(f"env: {name}: set by Frenzy for every job"), msg
    assert "To fix" in msg and "FRENZY_*" in msg
    # The proto path (a gRPC client's own JobSpec) says the same.
    spec = parse_entry(GOOD).to_proto()
    spec.env[name] = "1"
    with pytest.raises(ValueError, match=f"spec.env: {name}: set by Frenzy"):
        check_spec(spec)


def test_several_reserved_names_are_named_together_and_others_pass() -> None:
    msg = _refusal({"MASTER_PORT": "1", "CUDA_VISIBLE_DEVICES": "0", "OK": "1"})
    assert "CUDA_VISIBLE_DEVICES, MASTER_PORT: " in msg and "may not set them" in msg, msg
    # Names the agent lets a job set: its own variables, and what only looks like a reserved one.
    entry = parse_entry({**GOOD, "env": {"NCCL_DEBUG": "INFO", "cuda_visible_devices": "x", "MY_FRENZY_X": "1"}})
    check_spec(entry.to_proto())


def _model(ref: str) -> str | None:
    return unknown_model(parse_entry({**GOOD, "model": ref}).to_proto().model)


def test_unknown_model_names_what_is_wrong_and_suggests() -> None:
    assert _model("gpt2-124m") is None and _model("Llama-2-7b-hf") is None  # an alias
    assert _model("examples/models/qwen2.5-0.5b-config.json") is None  # read by the client, parsed as MARP does
    msg = _model("gpt2-12m")
    assert msg is not None and "unknown model 'gpt2-12m'" in msg and "gpt2-124m" in msg and "To fix" in msg
    msg = _model('{"hidden_size": 8}')
    assert msg is not None and "architecture" in msg
