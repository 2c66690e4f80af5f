"""bench/sim_tables.py's per-cell cache: a cell is reused only while the code it ran is unchanged,
and a change to the queue pass (code only the frenzy variants run) keeps the baselines' cells; the
truth and the width bound are inputs of the key (issue 32); shards split the missing cells and merge."""

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


def _cell(policy: str, **world: object) -> sim_tables.Cell:
    return sim_tables.Cell("t.csv", 0, "c.yaml", policy, 0, *sim_tables.EXACT, **world)  # type: ignore[arg-type]


def _store(cache: Path, policies: list[str], **world: object) -> None:
    """A cache holding one cell per policy, tagged with the digest the current tree gives it."""
    res = sim_tables.Results(cache, 1, fresh=True)
    kind = str(world.get("truth_kind", "independent"))
    for policy in policies:
        res.data[_cell(policy, **world).key()] = {"metrics": {}, "unfinished": {}, "code": res.version_of(policy, kind)}
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
    _store(cache, ["frenzy", "frenzy-paper", "sia", "hadar-approx", "hadar"])
    (fake_repo / "libs/has/queue_pass.py").write_text("# the queue pass, changed\n")
    assert _kept(cache) == {"sia", "hadar-approx", "hadar"}


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


def test_truth_and_width_are_in_the_key_and_old_entries_are_not_reused(fake_repo: Path, tmp_path: Path) -> None:
    keys = {_cell("frenzy", truth_kind=k, max_width_factor=w).key()
            for k in ("marp", "independent") for w in (None, 1.0, 2.0)}  # fmt: skip
    assert len(keys) == 6
    cache = tmp_path / "cells.json"
    res = sim_tables.Results(cache, 1, fresh=True)
    old = json.loads(_cell("sia").key())
    del old["truth_kind"], old["max_width_factor"]  # an entry from before issue 32, with a current digest
    cache.write_text(json.dumps({"cells": {json.dumps(old, sort_keys=True): {"code": res.version_of("sia", "marp")}}}))
    assert _kept(cache) == set()


def test_the_independent_truths_data_is_in_its_cells_digest(fake_repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cells.json"
    _store(cache, ["sia", "frenzy"], truth_kind="independent", max_width_factor=2.0)
    _store(tmp_path / "marp.json", ["sia", "frenzy"], truth_kind="marp", max_width_factor=2.0)
    assert _kept(cache) == {"sia", "frenzy"}
    data = fake_repo / sim_tables.TRUTH_DATA[0]
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("model,gpu,tokens_per_s\n")  # the measurements the truth is fitted on changed
    assert _kept(cache) == set()
    assert _kept(tmp_path / "marp.json") == {"sia", "frenzy"}  # (the marp truth reads none of it)


def test_shards_split_the_missing_cells_once_each_and_evenly() -> None:
    todo = [_cell(p, max_width_factor=k) for p in ("frenzy", "sia", "gavel", "opportunistic") for k in (1.0, 2.0, None)]
    est = sim_tables.Estimator({})
    shards = sim_tables.split_shards(todo, 4, est)
    assert sorted(c.key() for s in shards for c in s) == sorted(c.key() for c in todo)
    assert shards == sim_tables.split_shards(list(reversed(todo)), 4, est)  # (the same split on every machine)
    loads = [sum(map(est, s)) for s in shards]
    assert max(loads) - min(loads) <= max(map(est, todo))


def test_a_recorded_wall_time_is_the_estimate_and_like_cells_share_it() -> None:
    ran = _cell("sia", truth_kind="marp")
    old = json.loads(_cell("gavel").key())
    del old["truth_kind"], old["max_width_factor"]  # (before issue 32: the marp truth)
    est = sim_tables.Estimator({ran.key(): 100.0, json.dumps(old): 10.0})
    assert est(ran) == 100.0
    assert est(_cell("sia", truth_kind="marp", max_width_factor=2.0)) == 100.0  # a like cell
    assert est(_cell("sia", max_width_factor=2.0)) == pytest.approx(100.0 * est.TRUTH_COST["independent"])
    assert est(_cell("gavel")) == pytest.approx(10.0 * est.TRUTH_COST["independent"])
    assert est(_cell("hadar-approx")) == est.GUESS_S["hadar-approx"]


def test_shards_compute_their_cells_and_merge_into_the_cache(fake_repo: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    ran: list[str] = []

    def fake_run(cell: sim_tables.Cell) -> dict[str, object]:
        ran.append(cell.key())
        return {"metrics": {"avg_jct_s": 1.0}, "unfinished": {}, "wall_s": 0.0}

    monkeypatch.setattr(sim_tables, "run_cell", fake_run)
    cache = tmp_path / "cells.json"
    _store(cache, ["frenzy"], max_width_factor=2.0)  # one cell there already
    want = [_cell(p, max_width_factor=k) for p in ("frenzy", "sia", "hadar-approx") for k in (1.0, 2.0, None)]
    outs = []
    for i in range(3):
        out = tmp_path / f"shard-{i}.json"
        res = sim_tables.Results(cache, 1, fresh=False, out=out)
        mine = sim_tables.split_shards(res.missing(want), 3, res.estimate)[i]
        assert res.ensure(mine) == []
        res.save()
        outs.append(out)
    assert sorted(ran) == sorted(c.key() for c in want if c != _cell("frenzy", max_width_factor=2.0))
    assert len(json.loads(cache.read_text())["cells"]) == 1  # (a shard only reads the base cache)
    assert sim_tables.main(["merge", *map(str, outs), "--cache", str(cache)]) == 0
    merged = sim_tables.Results(cache, 1, fresh=False)
    assert merged.missing(want) == []


def test_the_cache_keeps_the_wall_times_of_cells_it_drops(fake_repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cells.json"
    res = sim_tables.Results(cache, 1, fresh=True)
    old = _cell("sia", truth_kind="marp")
    res.data[old.key()] = {"metrics": {}, "unfinished": {}, "wall_s": 321.0, "code": "other code"}
    res.save()
    again = sim_tables.Results(cache, 1, fresh=False)
    assert not again.has(old)  # (its result is of other code)
    again.save()  # drops it ...
    assert "cells" in json.loads(cache.read_text()) and not sim_tables.Results(cache, 1, fresh=False).data
    assert sim_tables.Results(cache, 1, fresh=False).estimate(old) == 321.0  # ... but not its cost


def test_a_deadline_leaves_cells_that_would_pass_it(fake_repo: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(sim_tables, "run_cell", lambda cell: {"metrics": {}, "unfinished": {}, "wall_s": 0.0})
    res = sim_tables.Results(tmp_path / "cells.json", 1, fresh=True)
    cheap, dear = _cell("opportunistic"), _cell("sia")  # (guessed 1 s and 120 s)
    assert res.ensure([dear, cheap], deadline_s=60.0) == [dear]
    assert res.has(cheap) and not res.has(dear)


def test_every_table_command_names_only_cells_of_known_worlds() -> None:
    for what in ("split", "docs", "readme"):
        need = sim_tables.Command(what, [0, 1, 2], "independent", 2.0).need()
        assert {c.truth_kind for c in need} == {"independent"}
        assert {c.max_width_factor for c in need} <= {1.0, 2.0, None}
    readme = sim_tables.Command("readme", [0], "independent", 2.0).need()
    assert {c.max_width_factor for c in readme} == {1.0, 2.0, None}
    assert {c.policy for c in readme} == set(sim_tables.README_COLUMNS)
