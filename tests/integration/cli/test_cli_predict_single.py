"""`frenzy predict` single-layout mode: the JSON contract automation relies on, and its errors.

In-process through typer's CliRunner (the subprocess behaviour of the command is covered by
test_cli.py); each bad flag must exit 2 with a message naming that flag."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

RUN = CliRunner()
BASE = ["predict", "--model", "llama-3-8b", "--seq-len", "8192", "--micro-batch", "2"]


def _run(*args: str) -> tuple[int, str]:
    res = RUN.invoke(app, list(args))
    return res.exit_code, res.output


def _json(*args: str) -> dict:
    """The JSON on stdout (a layout that does not fit adds its error and "To fix:" on stderr)."""
    return json.loads(RUN.invoke(app, list(args)).stdout)


def test_single_layout_json_contract() -> None:
    code, out = _run(*BASE, "--precision", "fsdp-bf16", "--dp", "8", "--tp", "1", "--pp", "1", "--zero", "3",
                     "--recompute", "op-sac", "--attention", "flash", "--loss", "torch", "--gpu", "H100-80GB",
                     "--json")  # fmt: skip
    assert code == 0, out
    d = json.loads(out)
    assert {"fits", "peak_allocated_bytes", "reserved_bytes", "device_bytes", "breakdown"} <= set(d)
    assert d["peak_allocated_bytes"] <= d["reserved_bytes"] < d["device_bytes"]
    b = d["breakdown"]
    assert sum(b.values()) == d["device_bytes"]
    assert d["fits"] is (d["device_bytes"] <= d["gpu_memory_bytes"])
    assert d["recipe"]["precision"] == "fsdp-bf16" and d["layout"]["zero_stage"] == 3


def test_layout_that_does_not_fit_still_prints_the_prediction() -> None:
    res = RUN.invoke(app, ["predict", "--model", "llama-2-70b", "--seq-len", "4096", "--micro-batch", "1", "--dp",
                           "1", "--gpu", "L4", "--json"])  # fmt: skip
    assert res.exit_code == 3, res.output
    d = json.loads(res.stdout)  # stdout stays JSON; the error and its "To fix:" are on stderr
    assert d["fits"] is False and d["device_bytes"] > d["gpu_memory_bytes"]
    assert "To fix:" in res.stderr and "To fix:" not in res.stdout


def test_bf16_is_pure_bf16_in_single_mode_and_stage_picks_the_stage() -> None:
    args = ["--dp", "1", "--pp", "4", "--global-batch", "16", "--gpu", "A100-80GB", "--json"]
    pure = _json(*BASE, "--precision", "bf16", *args)
    master = _json(*BASE, "--precision", "master-bf16", *args)
    assert pure["recipe"]["precision"] == "pure-bf16"
    # pure bf16 Adam keeps 2 bf16 states (4 B/param), master-bf16 fp32 master + 2 states (12 B/param)
    assert master["breakdown"]["optimizer_states"] == pytest.approx(3 * pure["breakdown"]["optimizer_states"], rel=1e-6)
    first = _json(*BASE, *args, "--stage", "first")
    last = _json(*BASE, *args, "--stage", "last")
    worst = _json(*BASE, *args, "--stage", "max")
    assert first["breakdown"]["logits"] == 0 and last["breakdown"]["logits"] > 0
    assert worst["device_bytes"] == max(first["device_bytes"], last["device_bytes"])


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--tp", "3", "--gpu", "H100-80GB"], "--tp"),
        (["--dp", "1", "--sequence-parallel", "--gpu", "H100-80GB"], "--sequence-parallel"),
        (["--dp", "1", "--recompute", "partial", "--gpu", "H100-80GB"], "--recompute"),
        (["--dp", "1", "--attention", "sparse", "--gpu", "H100-80GB"], "--attention"),
        (["--dp", "1", "--loss", "hinge", "--gpu", "H100-80GB"], "--loss"),
        (["--dp", "1", "--precision", "fp8", "--gpu", "H100-80GB"], "--precision"),
        (["--dp", "1", "--optimizer", "lion", "--gpu", "H100-80GB"], "--optimizer"),
        (["--dp", "1", "--zero", "5", "--gpu", "H100-80GB"], "--zero"),
        (["--dp", "1", "--stage", "middle", "--gpu", "H100-80GB"], "--stage"),
        (["--dp", "1"], "--gpu"),
        (["--dp", "1", "--gpu", "B300"], "--gpu"),
        (["--dp", "1", "--pp", "1", "--vpp", "2", "--gpu", "H100-80GB"], "--vpp"),
        (["--dp", "3", "--global-batch", "16", "--gpu", "H100-80GB"], "--global-batch"),
        (["--dp", "1", "--gpu-type", "L4", "--gpu", "H100-80GB"], "--gpu-type"),
        (["--dp", "1", "--precision", "fsdp-bf16", "--zero", "1", "--gpu", "H100-80GB"], "--zero"),
        (["--dp", "1", "--cp", "2", "--attention", "eager", "--gpu", "H100-80GB"], "--cp"),
    ],
)
def test_bad_or_contradictory_flags_name_the_flag(extra: list[str], flag: str) -> None:
    code, out = _run(*BASE, *extra)
    assert code == 2, out
    assert flag in out


def test_ranked_mode_new_policies_and_rank_by() -> None:
    code, out = _run("predict", "--model", "llama-2-7b", "--seq-len", "2048", "--global-batch", "16",
                     "--precision", "pure-bf16", "--rank-by", "gpu_hours", "--json")  # fmt: skip
    assert code == 0, out
    plans = json.loads(out)
    hours = [p["gpu_hours"] for p in plans]
    assert hours == sorted(hours) and all(p["explanation"] for p in plans)
    code, out = _run("predict", "--model", "llama-2-7b", "--seq-len", "2048", "--global-batch", "16",
                     "--rank-by", "vibes")  # fmt: skip
    assert code == 2 and "--rank-by" in out


# The README's third example as it was: 79.7 GiB on an 80 GB H100 (85.5 GB usable), 87.5 MiB over.
README_OLD = ["predict", "--model", "llama-3.1-8b", "--seq-len", "4096", "--micro-batch", "1", "--precision",
              "master-bf16", "--optimizer", "adamw", "--dp", "8", "--tp", "1", "--pp", "1", "--zero", "1",
              "--gpu", "H100-80GB"]  # fmt: skip
# What the README shows now (issue 30): the same job with ZeRO 2.
README_NEW = [a if a != "1" or README_OLD[i - 1] != "--zero" else "2" for i, a in enumerate(README_OLD)]


def test_readme_single_layout_example_fits_and_prints_a_table() -> None:
    res = RUN.invoke(app, README_NEW)
    assert res.exit_code == 0, res.output
    with pytest.raises(json.JSONDecodeError):  # a table for people, JSON only with --json
        json.loads(res.stdout)
    d = json.loads(RUN.invoke(app, [*README_NEW, "--json"]).stdout)
    assert d["fits"] is True and d["layout"]["zero_stage"] == 2
    out = res.stdout
    for label in ("peak allocated", "peak reserved", "device total", "headroom", "fits"):
        assert label in out, label
    # every term of the breakdown, with its exact bytes, and the three totals
    for term, value in d["breakdown"].items():
        assert term.replace("_", " ") in out and f"{value:,}" in out, term
    for key in ("peak_allocated_bytes", "reserved_bytes", "device_bytes", "gpu_memory_bytes"):
        assert f"{d[key]:,}" in out, key
    assert "does not fit" not in out


def test_layout_that_does_not_fit_says_by_how_much_and_how_to_fix_it() -> None:
    res = RUN.invoke(app, README_OLD)
    assert res.exit_code == 3, res.output
    assert "does not fit" in res.stdout and "over by" in res.stdout  # the table still shows
    err = res.stderr
    assert "needs 79.7 GiB per GPU; H100-80GB has 79.6 GiB (87.5 MiB over)" in err, err
    assert "To fix:" in err
    for flags in ("--zero 2", "--recompute op-sac", "--tp 2 --dp 4", "--gpu H100-96GB"):
        assert flags in err, flags


def test_every_suggested_fix_fits_when_applied() -> None:
    """The suggestions are checked, not guessed: each, added to the command, exits 0 with the memory it promised."""
    res = RUN.invoke(app, [*README_OLD, "--json"])
    assert res.exit_code == 3
    d = json.loads(res.stdout)
    assert d["fits"] is False and len(d["fixes"]) >= 4
    kinds = {f["flags"].split()[0] for f in d["fixes"]}
    assert {"--zero", "--recompute", "--tp", "--gpu"} <= kinds
    for fix in d["fixes"]:
        assert fix["device_bytes"] <= fix["gpu_memory_bytes"] and fix["paired"] is False
        again = RUN.invoke(app, [*README_OLD, *fix["flags"].split(), "--json"])  # a repeated option: the last wins
        assert again.exit_code == 0, (fix, again.output)
        got = json.loads(again.stdout)
        assert got["fits"] is True and got["device_bytes"] == fix["device_bytes"], fix
        assert got["recipe"]["global_batch"] == d["recipe"]["global_batch"], fix  # the same job
        assert got["layout"]["num_gpus"] == fix["num_gpus"] and got["gpu"] == fix["gpu"]


def test_fits_json_has_no_fixes_and_no_error() -> None:
    res = RUN.invoke(app, [*README_NEW, "--json"])
    assert res.exit_code == 0 and res.stderr == ""
    assert json.loads(res.stdout)["fixes"] == []


def test_when_no_single_change_fits_pairs_are_suggested_and_checked() -> None:
    args = ["predict", "--model", "llama-2-70b", "--seq-len", "4096", "--micro-batch", "1", "--dp", "1", "--gpu",
            "L4", "--json"]  # fmt: skip
    res = RUN.invoke(app, args)
    assert res.exit_code == 3
    fixes = json.loads(res.stdout)["fixes"]
    assert fixes and all(f["paired"] for f in fixes)
    assert "no single change fits" in res.stderr
    for fix in fixes:
        again = RUN.invoke(app, [*args, *fix["flags"].split()])
        assert again.exit_code == 0, (fix, again.output)


def test_when_nothing_tried_fits_the_fix_points_at_the_ranked_plans() -> None:
    res = RUN.invoke(app, ["predict", "--model", "llama-2-70b", "--seq-len", "32768", "--micro-batch", "1", "--dp",
                           "1", "--precision", "fp32", "--gpu", "T4", "--json"])  # fmt: skip
    assert res.exit_code == 3
    assert json.loads(res.stdout)["fixes"] == []
    assert "To fix:" in res.stderr and "ranked plans" in res.stderr


def test_a_smaller_micro_batch_keeps_the_global_batch() -> None:
    """Without --global-batch the default is dp x micro batch: a fix that lowers the micro batch names it."""
    args = ["predict", "--model", "llama-3-8b", "--seq-len", "4096", "--micro-batch", "4", "--dp", "8", "--zero", "3",
            "--precision", "fsdp-bf16", "--gpu", "H100-80GB", "--json"]  # fmt: skip
    res = RUN.invoke(app, args)
    assert res.exit_code == 3, res.output
    (mb,) = [f for f in json.loads(res.stdout)["fixes"] if f["flags"].startswith("--micro-batch")]
    assert "--global-batch 32" in mb["flags"]
    again = json.loads(RUN.invoke(app, [*args, *mb["flags"].split()]).stdout)
    assert again["fits"] and again["recipe"]["global_batch"] == 32 and again["layout"]["grad_accum"] > 1
