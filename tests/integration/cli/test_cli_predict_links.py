"""`frenzy predict` and the speed of the links between nodes, and the ranking's scaling rule (issue 19).

In-process through typer's CliRunner: --inter-node-gbps in single-layout and ranked mode, a
cluster file's inter_node_gbps reaching the plans, and a tiny job ranked onto one GPU."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from frenzy.cli.cmd_predict import _pools
from frenzy.cli.main import app

RUN = CliRunner()
# 7B over 16 H100s (2 nodes, DP across them) and over 8 (one node): only the first crosses nodes.
SINGLE = ["predict", "--model", "llama-2-7b", "--seq-len", "4096", "--micro-batch", "1", "--global-batch", "64",
          "--precision", "fp16", "--zero", "1", "--gpu", "H100-80GB", "--json"]  # fmt: skip
TINY = ["predict", "--model", "gpt2-124m", "--seq-len", "128", "--global-batch", "8", "--json"]


def _run(*args: str) -> tuple[int, str]:
    res = RUN.invoke(app, list(args))
    return res.exit_code, res.output


def _step(*args: str) -> float:
    code, out = _run(*args)
    assert code == 0, out
    return float(json.loads(out)["step_time_s"])


def test_single_layout_takes_the_inter_node_link() -> None:
    wide = [*SINGLE, "--dp", "16"]
    default = _step(*wide)
    slow = _step(*wide, "--inter-node-gbps", "1")
    assert slow > default * 1.05  # the DP reduce crosses nodes: a 1 GB/s link shows
    assert _step(*wide, "--inter-node-gbps", "50") == default  # H100's default is 50 GB/s per GPU
    narrow = [*SINGLE, "--dp", "8"]
    assert _step(*narrow, "--inter-node-gbps", "1") == _step(*narrow)  # one node: no inter-node traffic
    code, out = _run(*wide, "--inter-node-gbps", "0")
    assert code == 2 and "--inter-node-gbps" in out
    code, out = _run(*wide, "--min-scaling-eff", "0.5")
    assert code == 2 and "--min-scaling-eff" in out


def _cluster(tmp_path: Path, gbps: float) -> Path:
    path = tmp_path / f"c{gbps:g}.yaml"
    path.write_text(f"nodes:\n  - {{gpu: H100-80GB, count: 4, gpus_per_node: 8, inter_node_gbps: {gbps}}}\n"
                    "  - {gpu: A100-80GB, count: 1, gpus_per_node: 8}\n")  # fmt: skip
    return path


def test_cluster_file_carries_the_link_speed(tmp_path: Path) -> None:
    pools = {p.gpu_type: p for p in _pools(_cluster(tmp_path, 2.5), None) or []}
    assert pools["H100-80GB"].inter_node_gbps == 2.5 and pools["H100-80GB"].total_gpus == 32
    assert pools["A100-80GB"].inter_node_gbps is None  # not declared: the generation's default

    def plans(path: Path) -> dict[int, float]:
        code, out = _run("predict", "--model", "llama-2-7b", "--seq-len", "4096", "--global-batch", "64",
                         "--cluster", str(path), "--gpu-type", "H100-80GB", "--top", "50", "--json")  # fmt: skip
        assert code == 0, out
        return {p["num_gpus"]: p["step_time_s"] for p in json.loads(out)}

    slow, fast = plans(_cluster(tmp_path, 2.5)), plans(_cluster(tmp_path, 50))
    across = [n for n in slow if n > 8 and n in fast]
    assert across and all(slow[n] > fast[n] for n in across)
    assert all(slow[n] == fast[n] for n in slow if n <= 8 and n in fast)


def test_tiny_job_is_planned_on_one_gpu() -> None:
    for extra in ([], ["--gpu-type", "A100-80GB"]):
        code, out = _run(*TINY, *extra)
        assert code == 0, out
        assert json.loads(out)[0]["num_gpus"] == 1
    # The rule is what keeps it there: without it, a plan a few percent faster on more A100s wins.
    code, out = _run(*TINY, "--gpu-type", "A100-80GB", "--min-scaling-eff", "0")
    assert code == 0, out
    assert json.loads(out)[0]["num_gpus"] > 1
    code, out = _run(*TINY, "--min-scaling-eff", "2")
    assert code == 2 and "--min-scaling-eff" in out
