"""Progress bars for the CLI's long local commands (`frenzy simulate`, `frenzy measure`).

The work itself (``has.sim.engine``, ``frenzy.measure.parallel``) knows nothing of rich: it takes a
plain callback, and this module turns the calls into rich bars on stderr. Bars are drawn only when
stderr is a terminal and the user did not pass ``--no-progress``: piped or redirected stderr (CI,
logs) and stdout (tables, ``--json``) stay exactly as without them, and the bars vanish once the
work is done (transient), so the results print below a clean prompt.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

NoProgressOpt = Annotated[
    bool,
    typer.Option(
        "--no-progress", help="No progress bars on stderr (they are drawn only on a terminal anyway)."
    ),
]


def wanted(no_progress: bool) -> bool:
    """Whether to draw bars: asked for (no ``--no-progress``) and stderr is a terminal.

    ``isatty`` and not rich's ``is_terminal``: FORCE_COLOR in CI makes rich treat a pipe as a
    terminal, and a bar redrawn into a log file is hundreds of lines of noise."""
    if no_progress:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def sim_time(seconds: float) -> str:
    """Simulated time, short: 45 s, 12.5 min, 3.2 h, 4.1 d."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _bars(*extra: TextColumn) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *extra,
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)  # fmt: skip


class SimBars:
    """`frenzy simulate`'s bars: one per policy, jobs finished of the trace's and the simulated time,
    its seed in the label when there are several. Call it as ``cmd_simulate.run``'s ``on_progress``."""

    def __init__(self, policies: Sequence[str], seeds: Sequence[int], jobs: int) -> None:
        self.seeds = list(seeds)
        self.progress = _bars(TextColumn("jobs, simulated {task.fields[sim]}"))
        self.tasks: dict[str, TaskID] = {
            p: self.progress.add_task(self._label(p, self.seeds[0]), total=jobs, sim=sim_time(0), start=False)
            for p in policies
        }
        self._seed: dict[str, int] = {}

    def _label(self, policy: str, seed: int) -> str:
        if len(self.seeds) == 1:
            return policy
        return f"{policy} seed {seed} ({self.seeds.index(seed) + 1}/{len(self.seeds)})"

    def __call__(self, policy: str, seed: int, finished: int, total: int, now_s: float) -> None:
        task = self.tasks[policy]
        if self._seed.get(policy) != seed:  # this policy's next run: its bar (and clock) starts over
            self._seed[policy] = seed
            self.progress.reset(task, total=total, completed=finished, description=self._label(policy, seed),
                                sim=sim_time(now_s))  # fmt: skip
        else:
            self.progress.update(task, completed=finished, total=total, sim=sim_time(now_s))

    def __enter__(self) -> SimBars:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


@contextmanager
def rank_bar(label: str, ranks: int) -> Iterator[Progress]:
    """`frenzy measure`'s bar for a multi-GPU layout: ranks measured of ``ranks``; the task is the
    first (and only) one, its description says which rank runs now."""
    bar = _bars(TextColumn("ranks"))
    bar.add_task(label, total=ranks)
    with bar:
        yield bar
