"""bench/load.py run N times: the median and the spread (min, max) of each headline figure, as
one JSON line last on stdout (progress on stderr). Every option after ``--`` goes to load.py as
it is (``--json`` is added); each run is its own stack, one after the other, ``--pause-s`` apart.

    .venv/bin/python bench/load_runs.py --runs 5 -- --agents 100 --gpus-per-agent 8 --jobs 1000 --rate 100

A figure is quoted as its median over the runs that reported it, with the min and max beside it
(``n``: how many runs reported it; a run whose phase was skipped reports None). The machine is
part of the result: ``loadavg_1m_start`` / ``_end`` are figures too, and a run started in the
previous one's tail shows it there. ``--save FILE`` keeps every run's whole JSON line (one a
line). Exit 1 when any run was incomplete (its ``problems`` are listed), else 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

LOAD = Path(__file__).resolve().with_name("load.py")
# The figures quoted from each run: top-level keys of load.py's JSON, and "cpu_ms_per_job.KIND".
HEADLINE = ("placements_per_s", "placements_per_s_overall", "saturation_rate_per_s", "latency_rate_per_s",
            "submit_to_running_p50_s", "submit_to_running_p99_s", "submit_p50_ms", "submit_p99_ms",
            "backlog_new_job_to_running_s", "control_plane_cpu_ms_per_job",
            "cpu_ms_per_job.scheduler", "cpu_ms_per_job.api", "cpu_ms_per_job.redis", "cpu_ms_per_job.predictor",
            "cpu_ms_per_job.agents", "cpu_ms_per_job.load_generator", "loadavg_1m_start", "loadavg_1m_end")  # fmt: skip
COUNTS = ("submitted", "succeeded", "failed", "lost", "ran_twice", "refused")  # summed over the runs


def figure(out: dict, name: str) -> float | None:
    """``name`` ("a" or "a.b") of one run's JSON; None when missing."""
    value: object = out
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def spread(values: Sequence[float | None]) -> dict[str, object]:
    """Median, min and max of the values that are not None, the values themselves in run order."""
    have = [v for v in values if v is not None]
    return {"median": statistics.median(have) if have else None, "min": min(have) if have else None,
            "max": max(have) if have else None, "n": len(have), "values": list(values)}  # fmt: skip


def aggregate(outs: Sequence[dict], command: Sequence[str]) -> dict[str, object]:
    """The runs' headline figures as median and spread, the counts summed, what went wrong."""
    return {
        "bench": "load_runs", "runs": len(outs), "command": list(command),
        "figures": {name: spread([figure(o, name) for o in outs]) for name in HEADLINE},
        "counts": {c: sum(int(o.get(c) or 0) for o in outs) for c in COUNTS},
        "complete": all(o.get("complete") is True for o in outs),
        "problems": [f"run {i + 1}: {p}" for i, o in enumerate(outs) for p in (o.get("problems") or [])],
        "machine": {k: outs[0].get(k) for k in ("python", "machine", "cpus", "redis")} if outs else {},
        "sizes": outs[0].get("sizes") if outs else None,
    }  # fmt: skip


def run_once(load_args: Sequence[str], index: int, timeout_s: float) -> dict:
    """One load.py run -> its JSON (a stand-in naming the failure when it printed none)."""
    cmd = [sys.executable, str(LOAD), *load_args, "--json"]
    print(f"load_runs: run {index}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"complete": False, "problems": [f"load.py did not end within {timeout_s:g} s"]}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"complete": False, "problems": [f"load.py exited {proc.returncode} without a JSON line"]}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    load_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="how many times to run load.py (default 5)")
    ap.add_argument("--pause-s", type=float, default=10.0, help="seconds between runs, for the last one's tail")
    ap.add_argument("--run-timeout-s", type=float, default=1800.0, help="one run's wall-clock limit")
    ap.add_argument("--save", type=Path, default=None, help="write every run's whole JSON line to this file")
    args = ap.parse_args(own)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if "--json" in load_args:
        load_args.remove("--json")
    return args, load_args


def main(argv: list[str] | None = None) -> int:
    args, load_args = parse_args(argv)
    outs: list[dict] = []
    for i in range(args.runs):
        if i and args.pause_s > 0:
            time.sleep(args.pause_s)
        outs.append(run_once(load_args, i + 1, args.run_timeout_s))
    if args.save is not None:
        args.save.write_text("".join(json.dumps(o, separators=(",", ":")) + "\n" for o in outs), encoding="utf-8")
    result = aggregate(outs, ["bench/load.py", *load_args, "--json"])
    print(json.dumps(result, separators=(",", ":")))
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
