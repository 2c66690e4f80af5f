"""Mixed plans in the simulator (issue 33): frenzy against frenzy-single-type on the fragmented
cluster with Philly-derived traces, under the independent truth.

    PYTHONPATH=libs .venv/bin/python bench/sim_mixed.py                     # the table of docs/mixed-plans.md
    PYTHONPATH=libs .venv/bin/python bench/sim_mixed.py --max-request 4     # 13-14B jobs too (only a mix fits them)
    PYTHONPATH=libs .venv/bin/python bench/sim_mixed.py --trace 0e4a51 --seeds 3 --json

The trace is fitted to the cluster (``has.sim.traces.fit_to_cluster``), by a rule fixed before any
run: each Gavel/Philly job (msr seed=1 samples, their first 300 jobs, as bench/sim_tables.py's second
fresh Philly set) keeps its arrival; its request is cut to ``--max-request`` GPUs (2: the largest
request whose mapped models, 7-8B, fit one pool of fragmented.yaml -- 2 A100-80GB hold them; 4
maps to 13-14B models, which only a mixed plan fits there) and its reference GPU-time is scaled by
the cluster's dense bf16 compute over paper-64's (the cluster these traces run on in the tables),
so the trace loads fragmented.yaml as it loads paper-64. One simulation at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import yaml

import marp
from has.cluster_spec import ClusterSpec, parse_cluster
from has.sim.baselines import make_policy
from has.sim.engine import ProfileBook, simulate
from has.sim.traces import fit_to_cluster, read_trace

REPO = Path(__file__).resolve().parents[1]
FRAGMENTED = REPO / "examples/clusters/fragmented.yaml"
PAPER64 = REPO / "examples/clusters/paper-64.yaml"
TRACES = ("0e4a51", "103959", "11cb48", "6c71a0", "7f04ca")  # bench/sim_tables.py's PHILLY1
GAVEL1 = "data/traces/gavel/msr_philly_seed1/{}.trace"


def cluster(path: Path) -> ClusterSpec:
    return parse_cluster(yaml.safe_load(path.read_text()))


def bf16_flops(spec: ClusterSpec) -> float:
    """The cluster's dense bf16 peak, GPUs x each GPU's datasheet TFLOP/s."""
    return sum(g.count * g.gpus_per_node * marp.get_gpu(g.gpu).peak_tflops("bf16") for g in spec.groups)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", help=f"Gavel msr seed=1 trace id (default: {', '.join(TRACES)})")
    ap.add_argument("--max-jobs", type=int, default=300)
    ap.add_argument("--max-request", type=int, default=2)
    ap.add_argument("--cluster", type=Path, default=FRAGMENTED)
    ap.add_argument("--policies", default="frenzy,frenzy-single-type")
    ap.add_argument("--truth", default="independent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--memory-error", type=float, default=0.0)
    ap.add_argument("--speed-error", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    spec = cluster(args.cluster)
    factor = bf16_flops(spec) / bf16_flops(cluster(PAPER64))
    book = ProfileBook(spec)
    policies = args.policies.split(",")
    rows: list[dict[str, object]] = []
    for vc in args.trace or TRACES:
        jobs = fit_to_cluster(read_trace(REPO / GAVEL1.format(vc), max_jobs=args.max_jobs), args.max_request, factor)
        for k in range(args.seeds):
            seed = args.seed + k
            row: dict[str, object] = {"trace": vc, "seed": seed, "jobs": len(jobs)}
            for name in policies:
                t0 = time.process_time()
                res = simulate(spec, jobs, make_policy(name), profiles=book, seed=seed, truth=args.truth,
                               memory_error=args.memory_error, speed_error=args.speed_error)  # fmt: skip
                m = res.metrics()
                m["cpu_s"] = time.process_time() - t0
                m["unfinished"] = len(res.unfinished)
                row[name] = m
                print(f"{vc} seed {seed} {name}: avg JCT {m['avg_jct_s'] / 3600:.2f} h, finished "
                      f"{m['jobs_finished']}/{m['jobs_total']}, OOMs {m['oom_failures']}, mixed {m['jobs_mixed']} "
                      f"(avg JCT {m['avg_jct_mixed_s'] / 3600:.2f} h), {m['cpu_s']:.0f} CPU-s", file=sys.stderr)  # fmt: skip
            rows.append(row)
    if args.json:
        print(json.dumps({"length_factor": factor, "max_request": args.max_request, "truth": args.truth,
                          "memory_error": args.memory_error, "speed_error": args.speed_error, "rows": rows}, indent=1))
        return 0
    a, b = policies[0], policies[-1]
    print(f"length factor {factor:.4f} (fragmented / paper-64 bf16 compute), request cut at {args.max_request}, "
          f"truth {args.truth}, memory error {args.memory_error}, speed error {args.speed_error}")
    print(f"| trace | seed | {a} avg JCT (h) | {b} avg JCT (h) | ratio | done {a} | done {b} | OOMs | mixed jobs | censored ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for r in rows:
        ma, mb = r[a], r[b]  # type: ignore[index]
        same = ma["jobs_finished"] == mb["jobs_finished"] == ma["jobs_total"]
        ratio = ma["avg_jct_s"] / mb["avg_jct_s"] if same and mb["avg_jct_s"] else None
        if ratio is not None:
            ratios.append(ratio)
        print(f"| {r['trace']} | {r['seed']} | {ma['avg_jct_s'] / 3600:.2f} | {mb['avg_jct_s'] / 3600:.2f} | "
              f"{'-' if ratio is None else f'{ratio:.3f}'} | {ma['jobs_finished']}/{ma['jobs_total']} | "
              f"{mb['jobs_finished']}/{mb['jobs_total']} | {ma['oom_failures']}/{mb['oom_failures']} | {ma['jobs_mixed']} | "
              f"{ma['avg_jct_censored_s'] / mb['avg_jct_censored_s']:.3f} |")  # fmt: skip
    if ratios:
        print(f"mean ratio {statistics.mean(ratios):.3f} over {len(ratios)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
