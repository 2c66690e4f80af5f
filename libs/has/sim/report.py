"""Reports of simulator runs: the markdown summary table and the PNG plots.

Role: turn ``SimResult``s (one per policy, same trace and cluster) into what people
read — a markdown table with ratios against the baselines, a JCT CDF, utilization
over time and decision-time distributions. Files only; no decisions happen here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from has.sim.engine import SimResult, require

COLUMNS = (
    ("avg_jct_s", "avg JCT (h)", 3600.0),
    ("avg_jct_censored_s", "avg JCT all (h)", 3600.0),
    ("p50_jct_s", "p50 JCT (h)", 3600.0),
    ("p99_jct_s", "p99 JCT (h)", 3600.0),
    ("avg_queue_s", "avg queue (h)", 3600.0),
    ("makespan_s", "makespan (h)", 3600.0),
    ("utilization", "util", 1.0),
    ("rho_mean", "rho mean", 1.0),
    ("rho_max", "rho max", 1.0),
    ("oom_failures", "OOMs", 1.0),
    ("restarts", "restarts", 1.0),
    ("jobs_finished", "finished", 1.0),
    ("decision_ms_mean", "decision ms (mean)", 1.0),
    ("decision_ms_p99", "decision ms (p99)", 1.0),
)
# Shown as mean +- standard deviation over seeds when there are several.
SPREAD_KEYS = ("avg_jct_s", "avg_jct_censored_s", "rho_mean", "oom_failures", "restarts")

Metrics = dict[str, dict[str, float | int]]


def _fmt(value: float | int, scale: float) -> str:
    if isinstance(value, int):
        return str(value)
    v = value / scale
    if v == int(v) and scale == 1.0 and abs(v) >= 1:
        return str(int(v))
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"


def cell(m: dict[str, float | int], key: str, scale: float, sd: dict[str, float] | None = None) -> str:
    """One table cell: the value (finished as ``done/total``), ``+- sd`` over seeds where given."""
    if key == "jobs_finished" and "jobs_total" in m:
        return f"{_fmt(m[key], 1.0)}/{_fmt(m['jobs_total'], 1.0)}"
    counts = key in ("oom_failures", "restarts")
    text = f"{float(m[key]):.1f}" if counts and sd is not None and float(m[key]) != int(m[key]) else _fmt(m[key], scale)
    if sd is not None and key in sd and key in SPREAD_KEYS:
        text += f" ± {float(sd[key]):.1f}" if counts else f" ± {_fmt(float(sd[key]), scale)}"
    return text


def aggregate(runs: Sequence[Metrics]) -> tuple[Metrics, dict[str, dict[str, float]]]:
    """Per policy, the mean of each metric over ``runs`` (one per seed) and its standard
    deviation (population; 0 for one run)."""
    mean: Metrics = {}
    sd: dict[str, dict[str, float]] = {}
    for name in runs[0]:
        mean[name], sd[name] = {}, {}
        for key in runs[0][name]:
            xs = [float(r[name][key]) for r in runs]
            mu = sum(xs) / len(xs)
            v = runs[0][name][key]
            mean[name][key] = int(mu) if isinstance(v, int) and mu == int(mu) else mu
            sd[name][key] = math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs))
    return mean, sd


def ratios(
    metrics: Metrics, ours: str = "frenzy", unfinished: dict[str, frozenset[str]] | None = None
) -> dict[str, float]:
    """avg JCT of ``ours`` / avg JCT of each other policy (< 1: ours is faster), only for the
    policies that finished the same jobs as ``ours`` (``unfinished``: policy -> ids it left
    unfinished in any seed; None: compare the finished counts)."""
    if ours not in metrics or not metrics[ours]["avg_jct_s"]:
        return {}
    mine = float(metrics[ours]["avg_jct_s"])
    return {
        name: mine / float(m["avg_jct_s"])
        for name, m in metrics.items()
        if name != ours and m["avg_jct_s"] and same_jobs(metrics, ours, name, unfinished)
    }


def same_jobs(metrics: Metrics, a: str, b: str, unfinished: dict[str, frozenset[str]] | None) -> bool:
    """Did ``a`` and ``b`` finish the same set of jobs (so their averages are comparable)?"""
    if unfinished is not None:
        return unfinished.get(a, frozenset()) == unfinished.get(b, frozenset())
    return metrics[a]["jobs_finished"] == metrics[b]["jobs_finished"]


def markdown_table(
    metrics: Metrics,
    title: str = "",
    *,
    spread: dict[str, dict[str, float]] | None = None,
    unfinished: dict[str, frozenset[str]] | None = None,
    settings: str = "",
) -> str:
    """The table (mean +- sd over seeds where ``spread`` is given), the settings line, and the
    ratios of frenzy's avg JCT to the policies that finished the same jobs; a policy that
    finished a different set gets no ratio, and the line says so."""
    lines = []
    if title:
        lines += [title, ""]
    if settings:
        lines += [settings, ""]
    lines.append("| policy | " + " | ".join(h for _, h, _ in COLUMNS) + " |")
    lines.append("|---" * (len(COLUMNS) + 1) + "|")
    for name, m in metrics.items():
        sd = spread.get(name) if spread else None
        lines.append(f"| {name} | " + " | ".join(cell(m, k, s, sd) for k, _, s in COLUMNS) + " |")
    lines.append("")
    lines.append(
        "avg JCT: over finished jobs; avg JCT all: every job, an unfinished one counted until the run "
        "ended (censored); rho: Themis finish-time fairness, JCT / the job's time alone on 1/N of the "
        "cluster."
    )
    r = ratios(metrics, unfinished=unfinished)
    if r:
        lines.append("")
        lines.append(
            "avg JCT of frenzy relative to: "
            + ", ".join(
                f"{n} {v:.2f} ({abs(1 - v) * 100:.0f} % {'lower' if v <= 1 else 'higher'})"
                for n, v in r.items()
            )
        )
    if "frenzy" in metrics:
        skipped = [n for n in metrics if n != "frenzy" and not same_jobs(metrics, "frenzy", n, unfinished)]
        if skipped:
            lines.append("")
            lines.append(
                "no ratio against "
                + ", ".join(skipped)
                + ": it and frenzy did not finish the same jobs (compare avg JCT all)"
            )
    return "\n".join(lines) + "\n"


def priority_table(results: Sequence[SimResult]) -> str:
    """JCT by priority class, one row per (policy, class), highest class first: what a priority
    buys its jobs and costs the others. Empty when the trace has one class (no priority column)."""
    if not any(len({j.priority for j in r.jobs}) > 1 for r in results):
        return ""
    lines = [
        "| policy | priority | jobs | finished | avg JCT (h) | avg JCT all (h) | avg queue (h) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for p, m in r.by_priority().items():
            lines.append(
                f"| {r.policy} | {p} | {m['jobs']} | {m['jobs_finished']} | {_fmt(m['avg_jct_s'], 3600.0)} | "
                f"{_fmt(m['avg_jct_censored_s'], 3600.0)} | {_fmt(m['avg_queue_s'], 3600.0)} |"
            )
    return "\n".join(lines) + "\n"


def write_plots(results: Sequence[SimResult], out: Path) -> list[Path]:
    """jct_cdf.png, utilization.png, decision_ms.png in ``out``; returns the paths."""
    matplotlib: Any = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for r in results:
        jcts = sorted(j.jct_s / 3600.0 for j in r.jobs if j.jct_s is not None)
        if jcts:
            ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for r in results:
        xs, ys = [], []
        for t, busy in r.busy_timeline:
            xs.append(t / 3600.0)
            ys.append(busy / r.total_gpus)
        ax.step(xs, ys, where="post", label=r.policy, linewidth=0.8)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs busy (fraction)")
    ax.set_title("GPU utilization over time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "utilization.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    data = [[d * 1000.0 for d in r.decisions_s] or [0.0] for r in results]
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(results) + 1), [r.policy for r in results])
    ax.set_yscale("log")
    ax.set_ylabel("decision time per call (ms, log)")
    ax.set_title(f"Decision time on this cluster ({results[0].total_gpus} GPUs)" if results else "")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "decision_ms.png")
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


def plot_decision_vs_size(rows: Sequence[dict], path: Path, queued: int = 1000) -> Path:
    """Decision time vs cluster size, one line per policy, with the 5 ms target. Rows: gpus,
    policy and a median in ms — ``pass_ms_median`` (bench/has_decision.py; ``pass_ms_mean``
    for rows written before it reported medians) or ``decision_ms_median``
    (``has.sim.scale.time_decisions``, what ``frenzy simulate --decision-sizes`` writes)."""
    matplotlib: Any = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def ms(r: dict) -> float:
        for key in ("pass_ms_median", "decision_ms_median", "pass_ms_mean"):
            if key in r:
                return float(r[key])
        raise ValueError(f"row without a decision time: {sorted(r)}")

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for policy in sorted({str(r["policy"]) for r in rows}):
        pts = sorted((r["gpus"], ms(r)) for r in rows if r["policy"] == policy)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
    ax.axhline(5.0, color="grey", linestyle="--", linewidth=1, label="5 ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the cluster")
    ax.set_ylabel(f"one decision over {queued:,} queued jobs (ms)")
    ax.set_title("Decision time vs cluster size")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


__all__ = [
    "COLUMNS", "aggregate", "cell", "markdown_table", "plot_decision_vs_size", "priority_table", "ratios", "same_jobs",
    "write_plots",
]  # fmt: skip
