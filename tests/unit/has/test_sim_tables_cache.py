"""bench/sim_tables.py's per-cell cache: a cell is reused only while the code it ran is unchanged,
and a change to the queue pass (code only the frenzy variants run) keeps the baselines' cells."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import sim_tables  # noqa: E402


@pytest.fixture
def fake_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tree with the folders ``code_version`` digests, standing in for the repository."""
    (tmp_path / "libs/has/sim").mkdir(parents=True)
    (tmp_path / "libs/marp").mkdir(parents=True)
    (tmp_path / "libs/has/queue_pass.py").write_text("# the queue pass\n")
    (tmp_path / "libs/has/cluster.py").write_text("# the cluster view\n")
    (tmp_path / "libs/has/sim/baselines.py").write_text("# Sia, Gavel\n")
    (tmp_path / "libs/marp/model.py").write_text("# MARP\n")
    monkeypatch.setattr(sim_tables, "REPO", tmp_path)
    return tmp_path


def _cell(policy: str) -> sim_tables.Cell:
    return sim_tables.Cell("t.csv", 0, "c.yaml", policy, 0, *sim_tables.EXACT)


def _store(cache: Path, policies: list[str]) -> None:
    """A cache holding one cell per policy, tagged with the digest the current tree gives it."""
    res = sim_tables.Results(cache, 1, fresh=True)
    for policy in policies:
        res.data[_cell(policy).key()] = {"metrics": {}, "unfinished": {}, "code": res.version_of(policy)}
    res.save()


def _kept(cache: Path) -> set[str]:
    res = sim_tables.Results(cache, 1, fresh=False)
    return {json.loads(k)["policy"] for k in res.data}


def test_unchanged_code_reuses_every_cell(fake_repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cells.json"
    _store(cache, ["frenzy", "sia", "opportunistic"])
    assert _kept(cache) == {"frenzy", "sia", "opportunistic"}


def test_queue_pass_change_recomputes_only_frenzy(fake_repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cells.json"
    _store(cache, ["frenzy", "frenzy-paper", "sia", "hadar"])
    (fake_repo / "libs/has/queue_pass.py").write_text("# the queue pass, changed\n")
    assert _kept(cache) == {"sia", "hadar"}


@pytest.mark.parametrize("changed", ["libs/has/cluster.py", "libs/has/sim/baselines.py", "libs/marp/model.py"])
def test_shared_code_change_recomputes_everything(fake_repo: Path, tmp_path: Path, changed: str) -> None:
    cache = tmp_path / "cells.json"
    _store(cache, ["frenzy", "sia"])
    (fake_repo / changed).write_text("# changed\n")
    assert _kept(cache) == set()


def test_untagged_cells_are_not_trusted(fake_repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cells.json"  # the format before per-cell digests: one digest for the file
    cache.write_text(json.dumps({"code": sim_tables.code_version(), "cells": {_cell("sia").key(): {"metrics": {}}}}))
    assert _kept(cache) == set()


def test_a_sweep_cell_runs_frenzy_with_one_knob_changed() -> None:
    from has.policy import QueuePolicy

    swept = sim_tables.policy_of(_cell("frenzy@starvation_stretch=5"))
    assert swept.queue_policy == QueuePolicy.named(  # type: ignore[attr-defined]
        "frenzy", preempt_restart_s=120.0, explain=False, starvation_stretch=5.0
    )
    assert swept.name == "frenzy@starvation_stretch=5"  # type: ignore[attr-defined]  # (its own cache key)
    assert sim_tables.policy_of(_cell("frenzy")).queue_policy.starvation_stretch == 10.0  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="no_such_knob"):
        sim_tables.policy_of(_cell("frenzy@no_such_knob=1"))


def test_a_cell_left_out_with_errors_only_still_runs_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    case = ("Gavel x / c", "t.trace", 300, "c.yaml")
    monkeypatch.setattr(sim_tables, "NOT_RUN", {("Gavel x / c", "sia"): "not run (slow)"})
    monkeypatch.setattr(sim_tables, "NOT_RUN_WITH_ERRORS", {("Gavel x / c", "hadar"): "not run with errors (slow)"})
    exact = {c.policy for c in sim_tables.cells([case], ("frenzy", "sia", "hadar"), [0], sim_tables.EXACT)}
    noisy = {c.policy for c in sim_tables.cells([case], ("frenzy", "sia", "hadar"), [0], sim_tables.NOISY)}
    assert exact == {"frenzy", "hadar"} and noisy == {"frenzy"}
    assert sim_tables.not_run("Gavel x / c", "hadar", sim_tables.NOISY) == "not run with errors (slow)"
    assert sim_tables.not_run("Gavel x / c", "hadar", sim_tables.EXACT) is None
