"""Reports of simulator runs: the markdown summary table and the PNG plots.

Role: turn ``SimResult``s (one per policy, same trace and cluster) into what people
read — a markdown table with ratios against the baselines, a JCT CDF, utilization
over time and decision-time distributions. Files only; no decisions happen here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from has.sim.engine import SimResult

COLUMNS = (
    ("avg_jct_s", "avg JCT (h)", 3600.0),
    ("p50_jct_s", "p50 JCT (h)", 3600.0),
    ("p99_jct_s", "p99 JCT (h)", 3600.0),
    ("avg_queue_s", "avg queue (h)", 3600.0),
    ("makespan_s", "makespan (h)", 3600.0),
    ("utilization", "util", 1.0),
    ("oom_failures", "OOMs", 1.0),
    ("restarts", "restarts", 1.0),
    ("jobs_finished", "finished", 1.0),
    ("decision_ms_mean", "decision ms (mean)", 1.0),
    ("decision_ms_p99", "decision ms (p99)", 1.0),
)


def _fmt(value: float | int, scale: float) -> str:
    if isinstance(value, int):
        return str(value)
    v = value / scale
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"


def ratios(metrics: dict[str, dict[str, float | int]], ours: str = "frenzy") -> dict[str, float]:
    """avg JCT of ``ours`` / avg JCT of each other policy (< 1: ours is faster)."""
    if ours not in metrics or not metrics[ours]["avg_jct_s"]:
        return {}
    mine = float(metrics[ours]["avg_jct_s"])
    return {
        name: mine / float(m["avg_jct_s"]) for name, m in metrics.items() if name != ours and m["avg_jct_s"]
    }


def markdown_table(metrics: dict[str, dict[str, float | int]], title: str = "") -> str:
    lines = []
    if title:
        lines += [title, ""]
    lines.append("| policy | " + " | ".join(h for _, h, _ in COLUMNS) + " |")
    lines.append("|---" * (len(COLUMNS) + 1) + "|")
    for name, m in metrics.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m[k], s) for k, _, s in COLUMNS) + " |")
    r = ratios(metrics)
    if r:
        lines.append("")
        lines.append(
            "avg JCT of frenzy relative to: "
            + ", ".join(
                f"{n} {v:.2f} ({abs(1 - v) * 100:.0f} % {'lower' if v <= 1 else 'higher'})"
                for n, v in r.items()
            )
        )
    return "\n".join(lines) + "\n"


def write_plots(results: Sequence[SimResult], out: Path) -> list[Path]:
    """jct_cdf.png, utilization.png, decision_ms.png in ``out``; returns the paths."""
    import matplotlib

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
    import matplotlib

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


__all__ = ["COLUMNS", "markdown_table", "plot_decision_vs_size", "ratios", "write_plots"]
