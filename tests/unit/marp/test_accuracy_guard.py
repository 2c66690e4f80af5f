"""The regression guard (issue 36): MARP's accuracy tables as a test with per-row tolerances.

``bench/marp_accuracy.py`` predicts every validated row -- the published single-GPU set, the
multi-GPU oracle, the published multi-GPU set and the speed runs -- and
``tests/unit/marp/guard/accuracy_expected.json`` holds, per row, its measurement and the prediction
MARP made at the commit that wrote the file (``bench/marp_accuracy.py --write-guard``). A change
that moves any row's signed error by more than the row's ``tolerance_pp`` (points of the
measurement: 2 for memory, 3 for speed) fails here, naming the row; one that means to move rows
rewrites the file in the same commit, so the diff shows every row it moved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import marp_accuracy  # noqa: E402

EXPECTED = Path(__file__).parent / "guard" / "accuracy_expected.json"  # not data/: its JSON files are model configs


def _expected() -> list[dict[str, Any]]:
    return json.loads(EXPECTED.read_text(encoding="utf-8"))["rows"]


def violations(expected: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """One line per row that moved past its tolerance, was dropped, was added without an expected
    value, or whose measurement changed."""
    key = lambda r: (r["table"], r["id"])  # noqa: E731
    now_by, exp_by = {key(r): r for r in now}, {key(r): r for r in expected}
    out = [f"{t} {i}: in the table but not in {EXPECTED.name} (run bench/marp_accuracy.py --write-guard)"
           for (t, i) in now_by.keys() - exp_by.keys()]  # fmt: skip
    out += [f"{t} {i}: dropped from the table" for (t, i) in exp_by.keys() - now_by.keys()]
    for k in sorted(exp_by.keys() & now_by.keys()):
        e, n = exp_by[k], now_by[k]
        if n["measured"] != pytest.approx(e["measured"], rel=1e-9):
            out.append(f"{k[0]} {k[1]}: measurement changed {e['measured']} -> {n['measured']}")
            continue
        moved = 100.0 * (n["predicted"] - e["predicted"]) / e["measured"]
        if abs(moved) > e["tolerance_pp"]:
            out.append(f"{k[0]} {k[1]}: error {e['error_pct']:+.2f} % -> {n['error_pct']:+.2f} % "
                       f"(moved {moved:+.2f} points, tolerance {e['tolerance_pp']})")  # fmt: skip
    return out


def test_every_validated_row_is_within_its_tolerance_of_the_committed_prediction() -> None:
    bad = violations(_expected(), marp_accuracy.guard_rows())
    assert not bad, "MARP moved validated rows:\n" + "\n".join(bad)


def test_the_committed_file_covers_every_table_and_its_measurements_are_the_data() -> None:
    rows = _expected()
    tables = {r["table"] for r in rows}
    assert tables == {"memory", "multi_gpu_oracle", "multi_gpu_public", "speed"}
    for r in rows:
        assert r["measured"] > 0 and r["predicted"] > 0, r
        # the committed error is the committed prediction against the committed measurement (speed rows
        # are rounded to 0.1 token/s)
        assert r["error_pct"] == pytest.approx(100.0 * (r["predicted"] - r["measured"]) / r["measured"],
                                               abs=0.05), r["id"]  # fmt: skip
        assert 0.0 < r["tolerance_pp"] <= 3.0, r["id"]


def test_a_term_that_moves_rows_fails_the_guard_naming_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Doubling the allocator's fragmentation share moves only what is predicted as reserved or
    device memory (TT-23's max reserved, the nvidia-smi rows), not the allocated ones."""
    import marp.memory_terms as terms

    monkeypatch.setattr(terms, "FRAGMENTATION", 2 * terms.FRAGMENTATION)
    bad = violations(_expected(), marp_accuracy.guard_rows())
    named = {line.split(":")[0] for line in bad}
    assert "memory TT-23" in named and "multi_gpu_public TAO-01" in named
    assert not any(line.startswith(("memory MLM-", "multi_gpu_oracle ")) for line in bad)


def test_a_dropped_row_an_unknown_row_and_a_changed_measurement_are_named() -> None:
    rows = _expected()
    now = [dict(r) for r in rows[1:]] + [{**rows[0], "id": "NEW-01"}]
    now[0]["measured"] = now[0]["measured"] * 2
    bad = violations(rows, now)
    assert any(rows[0]["id"] in line and "dropped" in line for line in bad)
    assert any("NEW-01" in line and "--write-guard" in line for line in bad)
    assert any(rows[1]["id"] in line and "measurement changed" in line for line in bad)
