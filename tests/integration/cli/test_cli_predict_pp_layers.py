"""`frenzy predict --pp-layers` (issue 16): an uneven pipeline split in single-layout mode (pp
inferred from the split and --vpp) and in ranked mode (every plan runs the split); bad splits exit 2
naming the flag."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

RUN = CliRunner()
SINGLE = ["predict", "--model", "llama-2-7b", "--seq-len", "2048", "--micro-batch", "1", "--global-batch", "8",
          "--precision", "master-bf16", "--gpu", "H100-80GB", "--json"]  # fmt: skip
RANKED = ["predict", "--model", "llama-2-7b", "--seq-len", "2048", "--global-batch", "32", "--max-gpus", "16",
          "--gpu-type", "H100-80GB", "--json"]  # fmt: skip


def _json(*args: str) -> object:
    res = RUN.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_single_layout_charges_the_fullest_stage() -> None:
    even = _json(*SINGLE, "--pp", "4")
    uneven = _json(*SINGLE, "--pp-layers", "6,10,10,6")  # --pp 4 from the split
    assert isinstance(even, dict) and isinstance(uneven, dict)
    assert uneven["layout"]["pp"] == 4 and uneven["layout"]["pp_layers"] == [6, 10, 10, 6]
    assert uneven["recipe"]["pp_layers"] == [6, 10, 10, 6]
    assert uneven["device_bytes"] > even["device_bytes"]
    inter = _json(*SINGLE, "--pp-layers", "3,5,5,5,5,5,2,2", "--vpp", "2")
    assert isinstance(inter, dict) and (inter["layout"]["pp"], inter["layout"]["vpp"]) == (4, 2)


@pytest.mark.parametrize("legacy", [True, False])
def test_ranked_plans_run_the_split(legacy: bool) -> None:
    extra = [] if legacy else ["--precision", "amp-bf16"]  # the job-spec path and the library path
    plans = _json(*RANKED, *extra, "--pp-layers", "3,5,5,5,5,5,2,2")
    assert isinstance(plans, list) and plans
    assert {(p["layout"]["pp"], p["layout"].get("vpp", 1) or 1) for p in plans} <= {(2, 4), (4, 2), (8, 1)}


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--pp-layers", "6,10,10,5"], "places 31 layers"), (["--pp-layers", "6,x"], "not comma-separated"),
     (["--pp-layers", "8,8,8,8", "--pp", "2"], "4 stages given"), (["--pp-layers", "8,8,8", "--vpp", "2"], "--vpp 2")],
)  # fmt: skip
def test_bad_splits_exit_2_naming_the_flag(args: list[str], says: str) -> None:
    res = RUN.invoke(app, [*SINGLE, *args])
    assert res.exit_code == 2, res.output
    assert "--pp-layers" in res.output and says in res.output
    res = RUN.invoke(app, [*RANKED, "--pp-layers", "3,5"])
    assert res.exit_code == 2 and "--pp-layers" in res.output and "places 8 layers" in res.output
