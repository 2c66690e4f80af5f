"""`frenzy predict --objective/--deadline/--budget` and `frenzy gpus` prices (issue 35), in process.

The done-when command: llama-3.1-8b on examples/cluster.yaml ranked by dollars among the plans that
finish within 12 h, with $ and FINISH BY columns; a plan cheaper than the chosen one but too slow is
dropped with its reason; a cluster file's price_per_gpu_hour reprices the plans; bad values exit 2
naming the flag."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

RUN = CliRunner()
ROOT = Path(__file__).resolve().parents[3]
CLUSTER = str(ROOT / "examples" / "cluster.yaml")
DONE_WHEN = ["predict", "--model", "llama-3.1-8b", "--seq-len", "4096", "--global-batch", "64", "--objective", "cost",
             "--deadline", "12h", "--cluster", CLUSTER]  # fmt: skip
# One A100 node and cheap L4s (the operator's own rate): the L4 plans cost less and run longer.
CHEAP_L4 = ("nodes:\n  - {gpu: A100-80GB, count: 1, gpus_per_node: 8}\n"
            "  - {gpu: L4, count: 2, gpus_per_node: 8, price_per_gpu_hour: 0.2}\n")
JOB = ["predict", "--model", "llama-3.1-8b", "--seq-len", "4096", "--global-batch", "64", "--no-mixed"]


def _run(*args: str) -> tuple[int, str, str]:
    res = RUN.invoke(app, list(args), env={"COLUMNS": "250"})
    return res.exit_code, res.stdout, res.stderr


def _plans(*args: str) -> tuple[list[dict], str]:
    code, out, err = _run(*args, "--json")
    assert code == 0, out + err
    return json.loads(out), err


def test_the_done_when_command_ranks_by_dollars_within_the_deadline() -> None:
    plans, _ = _plans(*DONE_WHEN)
    assert plans, "examples/cluster.yaml holds the job"
    costs = [p["cost_usd"] for p in plans]
    assert costs == sorted(costs) and all(c > 0 for c in costs)
    assert all(p["runtime_s"] <= 12 * 3600 for p in plans)
    assert all(p["runtime_s"] == p["completion_s"] for p in plans)
    assert [p["rank"] for p in plans] == list(range(1, len(plans) + 1))
    code, out, _ = _run(*DONE_WHEN)
    assert code == 0, out
    header = next(line for line in out.splitlines() if "GPU-h" in line)
    assert re.search(r"GPU-h\s*┃\s*\$\s*┃\s*FINISH BY", header), header
    assert "cheapest first, finishing within 12.0 h" in out
    assert f"${costs[0]:,.2f}" in out


def test_a_cheaper_but_too_slow_plan_is_dropped_with_its_reason(tmp_path: Path) -> None:
    cluster = tmp_path / "cheap-l4.yaml"
    cluster.write_text(CHEAP_L4)
    every, _ = _plans(*JOB, "--objective", "cost", "--cluster", str(cluster))
    cheapest = every[0]
    assert cheapest["gpu_type"] == "L4"  # at $0.20 a GPU-hour the L4 plans cost least ...
    fastest = min(every, key=lambda p: p["runtime_s"])
    assert fastest["runtime_s"] < cheapest["runtime_s"] - 120  # ... and run longer
    minutes = -(-int(fastest["runtime_s"]) // 60)  # a deadline the fastest plan meets, the cheapest not
    kept, err = _plans(*JOB, "--objective", "cost", "--cluster", str(cluster), "--deadline", f"{minutes}m")
    assert kept and all(p["runtime_s"] <= minutes * 60 for p in kept)
    assert kept[0]["cost_usd"] > cheapest["cost_usd"]
    assert f"dropped {cheapest['num_gpus']}x L4: finishes in" in err and "> the deadline" in err
    # The table shows the same reason under the plans.
    code, out, _ = _run(*JOB, "--objective", "cost", "--cluster", str(cluster), "--deadline", f"{minutes}m")
    assert code == 0 and f"{cheapest['num_gpus']}x L4: finishes in" in out


def test_the_cluster_files_price_overrides_the_list_price(tmp_path: Path) -> None:
    listed, _ = _plans(*JOB, "--gpu-type", "A100-80GB", "--max-gpus", "8")
    cluster = tmp_path / "own.yaml"
    cluster.write_text("nodes:\n  - {gpu: A100-80GB, count: 1, gpus_per_node: 8, price_per_gpu_hour: 1.0}\n")
    own, _ = _plans(*JOB, "--cluster", str(cluster))
    by_layout = {(p["num_gpus"], json.dumps(p["layout"])): p for p in listed}
    for p in own:
        twin = by_layout.get((p["num_gpus"], json.dumps(p["layout"])))
        assert p["cost_usd"] == pytest.approx(p["gpu_hours"] * 1.0)
        if twin is not None:
            assert twin["cost_usd"] == pytest.approx(twin["gpu_hours"] * 3.43)


def test_nothing_within_the_limits_exits_3_with_the_limit_to_raise() -> None:
    code, out, err = _run(*DONE_WHEN[:-4], "--deadline", "1m", "--cluster", CLUSTER)
    assert code == 3
    assert "no plan meets the deadline (60 s)" in err and "To fix: raise --deadline to at least" in err
    code, _, err = _run(*JOB, "--budget", "0.01", "--gpu-type", "L4")
    assert code == 3 and "raise --budget to at least $" in err


@pytest.mark.parametrize(("args", "needle"), [
    (["--deadline", "12"], "--deadline: '12' has no unit"),
    (["--deadline", "-3h"], "--deadline: must be positive"),
    (["--deadline", "tomorrow"], "--deadline: 'tomorrow' is not a duration"),
    (["--budget", "-5"], "--budget: must be a positive number of dollars"),
    (["--budget", "plenty"], "--budget: must be a number of dollars"),
    (["--objective", "money"], "--objective: must be one of time, cost, gpu-hours"),
    (["--objective", "cost", "--rank-by", "gpu_hours"], "--rank-by gpu_hours contradicts --objective cost"),
    (["--deadline", "2h", "--dp", "2", "--gpu", "A100-80GB", "--micro-batch", "1"], "--deadline: ranks plans"),
])  # fmt: skip
def test_bad_values_exit_2_naming_the_flag(args: list[str], needle: str) -> None:
    base = [a for a in JOB if a != "--no-mixed"] if "--dp" in args else JOB  # --no-mixed ranks plans too
    code, out, err = _run(*base, *args)
    assert code == 2 and needle in err, out + err


def test_gpus_lists_the_price_and_the_cluster_files_own(tmp_path: Path) -> None:
    code, out, _ = _run("gpus", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["H100-80GB"]["price_per_gpu_hour"] == 6.88 and rows["T4"]["price_source"] == "list"
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {gpu: L4, count: 1, gpus_per_node: 2, price_per_gpu_hour: 0.3}\n")
    code, out, _ = _run("gpus", "--cluster", str(cluster), "--json")
    l4 = next(r for r in json.loads(out) if r["name"] == "L4")
    assert (l4["price_per_gpu_hour"], l4["list_price_per_gpu_hour"], l4["price_source"]) == (0.3, 0.81,
                                                                                             "cluster file")
    code, out, _ = _run("gpus", "--cluster", str(cluster))
    assert code == 0 and "$/GPU-h" in out and "$0.30 (cluster)" in out and "$6.88" in out


def test_every_json_plan_carries_cost_and_runtime_on_the_predictor_path_too() -> None:
    # No goal, no cluster file: the job-spec path the predictor service serves (plans priced at list prices).
    plans, _ = _plans("predict", "--model", "gpt2-124m", "--seq-len", "512", "--global-batch", "8",
                      "--gpu-type", "L4", "--gpu-type", "T4", "--precision", "fp16")  # fmt: skip
    assert plans
    for p in plans:
        assert p["runtime_s"] == p["completion_s"] > 0
        price = {"L4": 0.81, "T4": 0.53}[p["gpu_type"]]
        assert p["cost_usd"] == pytest.approx(p["gpu_hours"] * price)
