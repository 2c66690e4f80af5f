"""How long the `frenzy` command takes to answer before doing any work (issue 30).

A CLI that spends a second and a half importing the scheduler, the agent and Redis' client to
print `--help` feels broken, and every `frenzy jobs` in a script pays the same. This runs a few
commands that do no I/O as fresh processes, each `--reps` times, and prints one JSON object:
per command the median / min / max wall and CPU (user + system, of the child) milliseconds, and
the heavy modules the import of `frenzy.cli.main` pulls in (the server side, MARP's model, numpy,
pydantic: none should be).

    .venv/bin/python bench/cli_startup.py [--reps 15]

CPU time is the steadier number on a shared machine; compare runs on one machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "frenzy --help": ["-m", "frenzy.cli.main", "--help"],
    "frenzy --version": ["-m", "frenzy.cli.main", "--version"],
    "frenzy submit --help": ["-m", "frenzy.cli.main", "submit", "--help"],
    "import frenzy.cli.main": ["-c", "import frenzy.cli.main"],
    "python -c pass (floor)": ["-c", "pass"],
}
# What a CLI that only parses its options should not load: the server side, and MARP's model (numpy).
HEAVY = ("redis", "celery", "fastapi", "uvicorn", "prometheus_client", "cryptography", "frenzy.state.store",
         "frenzy.agent.daemon", "frenzy.scheduler", "marp.memory", "marp.recipe", "numpy", "pydantic")


def _time(args: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "COLUMNS": "100"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall * 1e3, cpu * 1e3


def _loaded_heavy_modules() -> list[str]:
    probe = (f"import sys, frenzy.cli.main; wanted = {HEAVY!r}; "
             "print('\\n'.join(sorted({m for m in sys.modules for w in wanted if m == w or m.startswith(w + '.')})))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return sorted({next(w for w in HEAVY if line == w or line.startswith(w + ".")) for line in out.split()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=15, help="runs of each command (default 15)")
    opts = parser.parse_args()
    for args in COMMANDS.values():  # warm the page cache and the .pyc files
        _time(args)
    rows = {}
    for name, args in COMMANDS.items():
        samples = [_time(args) for _ in range(opts.reps)]
        walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
        rows[name] = {"wall_ms_median": round(statistics.median(walls), 1), "wall_ms_min": round(min(walls), 1),
                      "wall_ms_max": round(max(walls), 1), "cpu_ms_median": round(statistics.median(cpus), 1),
                      "cpu_ms_min": round(min(cpus), 1)}
    print(json.dumps({"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                      "load_avg_1m": round(os.getloadavg()[0], 2), "reps": opts.reps, "commands": rows,
                      "heavy_modules_imported_by_the_cli": _loaded_heavy_modules()}, indent=1))


if __name__ == "__main__":
    main()
