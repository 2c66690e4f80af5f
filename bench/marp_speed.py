"""How fast MARP ranks plans: a 70B model over GPU types with up to 1,024 GPUs each.

Runs ``enumerate_plans`` (the vectorised layout grid: TP x PP x DP x ZeRO x micro-batch x
recompute, memory for every layout, step time for every layout, ranking and explanations)
repeatedly and prints the median and other percentiles as JSON. Target: median < 20 ms over the
12 GPU types the target was set on (``BENCH_GPUS``); ``--all-gpus`` times the whole catalog;
``--mixed`` also ranks plans over two GPU types (issue 33, docs/mixed-plans.md), as ``frenzy
predict --cluster`` does for a cluster of several types; the target holds with them on.
Run: ``.venv/bin/python bench/marp_speed.py [--repeats N] [--all-gpus] [--mixed]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "libs"))

from marp import GpuPool, TrainingRecipe, enumerate_plans, get_model, list_gpus  # noqa: E402

# The 12 types of the catalog when the 20 ms target was set, so timings stay comparable as it grows.
BENCH_GPUS: tuple[str, ...] = ("V100-16GB", "V100-32GB", "T4", "A10", "A10G", "L4", "L40S", "A100-40GB",
                               "A100-80GB", "H100-80GB", "H200", "RTX-4090")  # fmt: skip


def run(repeats: int = 50, all_gpus: bool = False, mixed: bool = False) -> dict[str, object]:
    model = get_model("llama-3-70b")
    recipe = TrainingRecipe(seq_len=4096, global_batch=1024, train_steps=10_000)
    names = [g.name for g in list_gpus()] if all_gpus else list(BENCH_GPUS)
    pools = [GpuPool(name, 1024, 8) for name in names]
    plans = enumerate_plans(model, recipe, pools, mixed=mixed)  # warm-up (imports, caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        enumerate_plans(model, recipe, pools, mixed=mixed)
        times.append((time.perf_counter() - start) * 1000.0)
    times.sort()
    return {
        "model": model.name, "gpu_types": len(pools), "max_gpus_per_type": 1024, "repeats": repeats,
        "median_ms": round(statistics.median(times), 2), "p10_ms": round(times[len(times) // 10], 2),
        "p90_ms": round(times[(9 * len(times)) // 10], 2), "min_ms": round(times[0], 2),
        "plans": len(plans.plans), "best": plans.plans[0].to_dict() if plans.plans else None,
        "mixed": mixed, "mixed_plans": sum(1 for p in plans.plans if len(p.gpus_by_type) > 1), "target_ms": 20.0, "python": platform.python_version(), "machine": platform.machine(),
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--all-gpus", action="store_true", help="every catalog GPU type, not the 12")
    parser.add_argument("--mixed", action="store_true", help="also rank plans over two GPU types")
    args = parser.parse_args()
    out = run(args.repeats, args.all_gpus, args.mixed)
    out.pop("best")
    print(json.dumps(out, indent=2))
