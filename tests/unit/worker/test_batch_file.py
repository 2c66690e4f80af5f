"""The batch file format: shape errors say what and where; defaults merge; local model files travel inline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy.worker.batch import BatchFileError, Outcome, load_batch_file, parse_batch

ROOT = Path(__file__).resolve().parents[3]


def test_example_batch_loads() -> None:
    entries = load_batch_file(ROOT / "examples" / "jobs.yaml")
    assert [e["name"] for e in entries] == ["gpt2-small", "qwen-tiny", "gpt2-medium-l4"]
    assert all(e["train_steps"] == 100 for e in entries)  # from defaults:


def test_top_level_list_and_defaults_under_entries() -> None:
    assert parse_batch([{"name": "a"}]) == [{"name": "a"}]
    out = parse_batch({"defaults": {"seq_len": 1, "name": "d"}, "jobs": [{"name": "a"}, {}]})
    assert out == [{"seq_len": 1, "name": "a"}, {"seq_len": 1, "name": "d"}]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("text", "expected a list"),
        ({"job": []}, "unknown top-level key(s): job"),
        ({"defaults": {}}, "no `jobs:` list"),
        ({"jobs": []}, "no jobs"),
        ({"jobs": [{"name": "a"}, 3]}, "jobs[1]: expected a mapping"),
        ({"jobs": [{}], "defaults": [1]}, "defaults: expected a mapping"),
        (None, "expected a list"),
    ],
)
def test_shape_errors_say_what_is_wrong(data: object, message: str) -> None:
    with pytest.raises(BatchFileError) as info:
        parse_batch(data)
    assert message in str(info.value)


def test_yaml_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("jobs:\n  - name: a\n    model: b: c\n")
    with pytest.raises(BatchFileError, match=r"line 3"):
        load_batch_file(path)
    with pytest.raises(BatchFileError, match="cannot read"):
        load_batch_file(tmp_path / "missing.yaml")


def test_model_file_next_to_the_batch_travels_inline(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64}
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    (tmp_path / "b.yaml").write_text("jobs:\n  - {name: a, model: tiny.json}\n  - {name: b, model: gpt2-124m}\n"
                                     "  - {name: c, when: 2024-01-01}\n")
    a, b, c = load_batch_file(tmp_path / "b.yaml")
    assert json.loads(a["model"]) == config and b["model"] == "gpt2-124m"
    assert c["when"] == "2024-01-01"  # YAML dates become JSON strings
    (tmp_path / "broken.json").write_text("{nope")
    (tmp_path / "c.yaml").write_text("jobs: [{name: a, model: broken.json}]\n")
    with pytest.raises(BatchFileError, match="model: cannot read config file"):
        load_batch_file(tmp_path / "c.yaml")


def test_outcome_round_trip_and_garbage() -> None:
    o = Outcome(index=3, status="submitted", job_id="job-1", name="n", at=1.5, attempts=2)
    assert Outcome.from_json(3, o.to_json()) == o and o.ok and o.final
    bad = Outcome.from_json(1, "{nope")
    assert bad.status == "error" and not bad.ok
