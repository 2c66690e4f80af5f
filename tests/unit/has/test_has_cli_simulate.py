"""`frenzy simulate`: the JSON shape automation reads, outputs, and exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

REPO = Path(__file__).resolve().parents[3]
KEYS = {"avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "utilization", "oom_failures",
        "restarts", "jobs_finished", "jobs_total", "avg_jct_censored_s", "rho_mean", "rho_max",
        "decision_ms_mean", "decision_ms_p99", "deadline_jobs", "deadline_misses", "deadline_miss_rate",
        "gpu_hours", "cost_usd", "jobs_mixed", "avg_jct_mixed_s"}  # fmt: skip
CLUSTER = str(REPO / "examples/clusters/paper-64.yaml")


@pytest.mark.slow
def test_simulate_json_table_and_outputs(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "--cluster", CLUSTER, "--trace",
                              str(REPO / "data/traces/pollux/workloads/workload-1.csv"), "--max-jobs", "25",
                              "--policies", "frenzy,frenzy-paper,opportunistic,sia", "--json",
                              "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data["policies"]) == ["frenzy", "frenzy-paper", "opportunistic", "sia"]
    for m in data["policies"].values():
        assert set(m) == KEYS and m["jobs_finished"] == 25
    for name in ("results.json", "summary.md", "jct_cdf.png", "utilization.png", "decision_ms.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| frenzy |" in (tmp_path / "summary.md").read_text()
    table = runner.invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "8", "--policies", "frenzy"])
    assert table.exit_code == 0 and "avg JCT" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--synthetic", "3", "--policies", "frenzy,nope"], "unknown policy 'nope'"),
        (["--trace", "TRACE_BAD"], "field model: unknown model 'not-a-model'"),
        (["--trace", "/no/such/trace.csv"], "cannot read trace"),
        (["--synthetic", "3", "--trace", "TRACE_BAD"], "exactly one of"),
        (["--synthetic", "3", "--fail-node", "nope@10"], "no node 'nope' in the cluster file"),
        (["--synthetic", "3", "--fail-node", "a100-0"], "expected NAME@SECONDS"),
        (["--synthetic", "3", "--fail-node", "a100-0@soon"], "expected NAME@SECONDS"),
        (["--synthetic", "3", "--fail-node", "a100-0@10:0"], "DOWN_SECONDS > 0"),
        (["--synthetic", "3", "--decision-sizes", "100,lots"], "--decision-sizes: 'lots' is not a cluster size"),
        (["--synthetic", "3", "--decision-sizes", "4"], "--decision-sizes: '4' is not a cluster size in GPUs (8..100,000)"),
        (["--synthetic", "3", "--decision-sizes", "64", "--decision-queue", "-1"], "--decision-queue: must be >= 0"),
        (["--synthetic", "3", "--restart-s", "-5"], "--restart-s: must be a number of seconds >= 0, got -5.0"),
        (["--synthetic", "3", "--memory-error", "-0.1"], "--memory-error: must be a log-normal sigma in [0, 2]"),
        (["--synthetic", "3", "--speed-error", "9"], "--speed-error: must be a log-normal sigma in [0, 2]"),
        (["--synthetic", "3", "--seeds", "0"], "--seeds: must be 1..100 runs, got 0"),
    ],
)
def test_bad_input_exits_2_naming_the_field(tmp_path: Path, args: list[str], needle: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "job_id,submit_s,model,seq_len,global_batch,tokens,gpu_type,gpus\na,0,not-a-model,1024,64,9,,1\n"
    )
    args = [str(bad) if a == "TRACE_BAD" else a for a in args]
    res = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, *args])
    assert res.exit_code == 2
    assert needle in " ".join(res.output.split())


def test_bad_cluster_exits_2(tmp_path: Path) -> None:
    c = tmp_path / "c.yaml"
    c.write_text("nodes:\n  - {gpu: Z80, count: 1}\n")
    res = CliRunner().invoke(app, ["simulate", "--cluster", str(c), "--synthetic", "2"])
    assert res.exit_code == 2 and "unknown GPU type 'Z80'" in " ".join(res.output.split())


def test_fail_node_requeues_the_running_job_until_the_node_is_back(tmp_path: Path) -> None:
    """One job on a one-node cluster: a failure at 600 s for 900 s costs it exactly the
    downtime plus the restart (progress is kept); repeated failures add up; a node that
    never comes back leaves the job unfinished and the run still ends."""
    cluster = tmp_path / "one.yaml"
    cluster.write_text("nodes:\n  - {gpu: H100-80GB, count: 1, gpus_per_node: 8, name_prefix: h}\n")
    trace = tmp_path / "one.csv"
    trace.write_text(
        "job_id,submit_s,model,seq_len,global_batch,tokens,gpu_type,gpus\n"
        "j1,0.0,llama-3.2-1b,2048,64,2000000000,,1\n"
    )

    def run(*fail: str) -> dict:
        args = [
            "simulate",
            "--cluster",
            str(cluster),
            "--trace",
            str(trace),
            "--policies",
            "frenzy,sia",
            "--json",
        ]
        for f in fail:
            args += ["--fail-node", f]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    base = run()["policies"]
    once = run("h-0@600:900")
    assert once["node_failures"] == [{"node": "h-0", "at_s": 600.0, "down_s": 900.0}]
    for name in ("frenzy", "sia"):
        assert base[name]["restarts"] == 0 and base[name]["jobs_finished"] == 1
        m = once["policies"][name]
        assert m["restarts"] == 1 and m["jobs_finished"] == 1
        # down 900 s, then the restart cost (120 s) before progress resumes
        assert m["avg_jct_s"] - base[name]["avg_jct_s"] == pytest.approx(900.0 + 120.0)
    twice = run("h-0@600:900", "h-0@3000:100")["policies"]["frenzy"]
    assert twice["restarts"] == 2
    assert twice["avg_jct_s"] - base["frenzy"]["avg_jct_s"] == pytest.approx(900.0 + 100.0 + 2 * 120.0)
    gone = run("h-0@600")
    assert gone["node_failures"][0]["down_s"] is None
    assert gone["policies"]["frenzy"]["jobs_finished"] == 0 and gone["policies"]["frenzy"]["restarts"] == 1


def test_decision_sizes_add_the_decision_time_vs_cluster_size(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "6", "--policies",
                                   "frenzy,opportunistic", "--decision-sizes", "64,32", "--decision-queue", "15",
                                   "--json", "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    rows = data["decision_vs_size"]
    assert [(r["policy"], r["queued_jobs"]) for r in rows] == [("frenzy", 15), ("opportunistic", 15)] * 2
    assert rows[0]["gpus"] < rows[2]["gpus"]  # sizes in increasing order
    assert all(r["decision_ms_median"] > 0 for r in rows)
    assert json.loads((tmp_path / "results.json").read_text())["decision_vs_size"] == rows
    assert (tmp_path / "decision_vs_size.png").stat().st_size > 0
    table = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "4", "--policies", "frenzy",
                                     "--decision-sizes", "32", "--decision-queue", "5"])  # fmt: skip
    assert table.exit_code == 0 and "decision ms vs cluster size" in table.stdout


def test_restart_cost_is_what_a_restart_costs_in_the_run() -> None:
    """Gavel rotates jobs between rounds on a busy cluster; each rotation restarts a job, so its
    average JCT grows with --restart-s (and the JSON says which cost the run used)."""
    def run(restart: str) -> dict:
        res = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "30", "--jobs-per-hour",
                                       "200", "--policies", "gavel", "--restart-s", restart, "--json"])  # fmt: skip
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    cheap, dear = run("0"), run("600")
    assert cheap["restart_s"] == 0.0 and dear["restart_s"] == 600.0
    assert dear["policies"]["gavel"]["restarts"] > 0
    assert dear["policies"]["gavel"]["avg_jct_s"] > cheap["policies"]["gavel"]["avg_jct_s"]


def test_seeds_errors_and_unfinished_jobs_are_reported(tmp_path: Path) -> None:
    """Issue 18: --seeds N gives mean and spread; every table names its seeds and error settings;
    a job no GPU of the cluster holds is reported with why, counted in the censored mean, and no
    ratio is printed between policies that finished different jobs."""
    cluster = tmp_path / "tiny.yaml"
    cluster.write_text("nodes:\n  - {gpu: L4, count: 1, gpus_per_node: 4, name_prefix: l4}\n")
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,model,seq_len,global_batch,tokens,gpu_type,gpus\n"
                     "small,0,qwen2.5-0.5b,2048,64,20000000,,2\n"
                     "huge,10,qwen2.5-72b,2048,64,20000000,,4\n")  # fmt: skip
    runner = CliRunner()
    args = ["simulate", "--cluster", str(cluster), "--trace", str(trace), "--policies", "frenzy,opportunistic",
            "--seeds", "3", "--memory-error", "0.05", "--speed-error", "0.1"]  # fmt: skip
    res = runner.invoke(app, [*args, "--json", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["seeds"] == [0, 1, 2] and len(data["per_seed"]) == 3
    assert data["truth"] == {"model": "independent", "runtime_noise": 0.1, "memory_error": 0.05, "speed_error": 0.1}
    assert data["max_width_factor"] is None
    for name in ("frenzy", "opportunistic"):
        m = data["policies"][name]
        assert m["jobs_finished"] == 1 and m["jobs_total"] == 2
        assert "too big for this cluster" in data["unfinished"][name]["huge"]
        # the unfinished job counts, from its arrival (10 s) until the run ended (a lower bound)
        assert m["avg_jct_censored_s"] >= (m["avg_jct_s"] + m["avg_jct_s"] - 10.0) / 2
        assert set(data["spread"][name]) == set(m)
    summary = (tmp_path / "o" / "summary.md").read_text()
    assert "seeds 0-2 (mean ± sd); truth: independent, runtime noise 0.1, memory error 0.05, speed error 0.1" in summary
    assert "1/2" in summary and "huge" in summary
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "did not finish 1 jobs" in table.stdout


def test_no_ratio_between_policies_that_finished_different_jobs() -> None:
    from has.sim.report import markdown_table

    m = {"frenzy": {"avg_jct_s": 100.0, "jobs_finished": 9}, "sia": {"avg_jct_s": 200.0, "jobs_finished": 10},
         "gavel": {"avg_jct_s": 400.0, "jobs_finished": 9}}  # fmt: skip
    for v in m.values():
        v.update({k: 0.0 for k in ("avg_jct_censored_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s",
                                   "utilization", "rho_mean", "rho_max", "decision_ms_mean", "decision_ms_p99")})
        v.update({"oom_failures": 0, "restarts": 0, "jobs_total": 10})
    text = markdown_table(m, unfinished={"frenzy": frozenset({"x"}), "sia": frozenset(), "gavel": frozenset({"x"})})
    assert "gavel 0.25" in text and "sia 0." not in text
    assert "no ratio against sia" in text
    # the same counts but different jobs: still no ratio
    text = markdown_table(m, unfinished={"frenzy": frozenset({"x"}), "sia": frozenset(), "gavel": frozenset({"y"})})
    assert "no ratio against sia, gavel" in text


def test_a_missing_sim_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """highspy and matplotlib are the optional `frenzy[sim]` extra: without them the command says
    so (exit 2) before running, and the policy itself raises a SimError naming the extra."""
    import sys

    from has.cluster_spec import parse_cluster
    from has.sim.baselines import make_policy
    from has.sim.engine import SimError, simulate
    from has.sim.traces import synthetic

    monkeypatch.setitem(sys.modules, "highspy", None)  # import fails as if not installed
    res = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "3", "--policies", "frenzy,sia"])
    assert res.exit_code == 2 and "pip install 'frenzy[sim]'" in res.output and "sia" in res.output
    ok = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "3", "--policies", "frenzy"])
    assert ok.exit_code == 0, ok.output  # frenzy needs neither
    spec = parse_cluster({"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8}]})
    with pytest.raises(SimError, match=r"highspy is needed .*'frenzy\[sim\]'"):
        simulate(spec, synthetic(3, seed=1), make_policy("gavel"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "3", "--policies", "frenzy",
                                   "--out", "/tmp/never-written"])  # fmt: skip
    assert res.exit_code == 2 and "--out: matplotlib is needed" in res.output
