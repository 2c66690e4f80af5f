"""Rich tables for people and plain dicts for --json: one place for both.

Tables follow SkyPilot's lead: the plan table has a CHOSEN column, sizes in
GiB with one decimal, and a pending job always shows its reason.

Strings users wrote (job names, reasons, paths, node names) reach a terminal only
through ``user_text``: control characters (escape sequences that retitle the window,
clear the screen, fake output) are shown as visible ``\x1b`` escapes, and rich markup
in them is printed, not obeyed (issue 14 item 12). ``console()`` also escapes control
characters in whatever it prints, and never emits a hyperlink, as a backstop for
strings built elsewhere. JSON output is untouched: json.dumps escapes them already.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.errors import MarkupError, StyleSyntaxError
from rich.markup import escape
from rich.style import Style
from rich.table import Table
from rich.text import Span, Text

from frenzy.rpc.protojson import to_json
from frenzy.v1 import types_pb2

GiB = 1024**3

STATE_STYLE = {
    "PENDING": "yellow", "RESERVED": "cyan", "LAUNCHING": "cyan", "RUNNING": "blue",
    "SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "magenta",
}


# C0 controls, DEL and C1 controls (ESC, CSI, OSC, BEL, backspace, carriage return, ...), and the
# bidirectional overrides that make text read differently from what it is.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_EXCEPT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain_text(value: object, keep_lines: bool = False) -> str:
    """``value`` as text with every control character shown as an escape (``\\x1b``); newlines and
    tabs too unless ``keep_lines``."""
    return (_CONTROL_EXCEPT_LINES if keep_lines else _CONTROL).sub(_visible, str(value))


def user_text(value: object, keep_lines: bool = False) -> str:
    """A string a user wrote, ready for a rich console: control characters visible, markup inert."""
    return escape(plain_text(value, keep_lines))


def gib(n: int | float) -> str:
    return f"{n / GiB:.1f}"


def state_name(value: int) -> str:
    return types_pb2.JobState.Name(value).removeprefix("JOB_STATE_")


def styled_state(value: int) -> str:
    name = state_name(value)
    return f"[{STATE_STYLE.get(name, 'white')}]{name}[/]"


def when(ts: float, date: bool = False, now: float | None = None) -> str:
    """A local time for a table cell: ``14:03:07`` when it is today, ``2026-11-28 14:03`` on any
    other day (a 30-day expiry must not read like a time today), and always with the date when
    ``date``; "-" for 0 (never)."""
    if not ts:
        return "-"
    at = dt.datetime.fromtimestamp(ts)
    today = dt.datetime.fromtimestamp(time.time() if now is None else now).date()
    return at.strftime("%H:%M:%S") if not date and at.date() == today else at.strftime("%Y-%m-%d %H:%M")


def when_full(ts: float) -> str:
    """A local date and time to the second (``2026-11-28 14:03:07``), for one job's details; "-" for 0."""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.2f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def money(usd: float) -> str:
    """Dollars for a table cell: ``$12.34``, ``$12,345``; "-" for 0 (no price known)."""
    if not usd:
        return "-"
    return f"${usd:,.2f}" if usd < 10_000 else f"${usd:,.0f}"


def finish_by(seconds: float, now: float) -> str:
    """When a run of ``seconds`` started at ``now`` ends, local time: ``14:05`` today, ``Tue 14:05``
    within the week, else the date; "-" past ten years."""
    if not 0 <= seconds <= 10 * 366 * 86400:
        return "-"
    at = dt.datetime.fromtimestamp(now + seconds)
    start = dt.datetime.fromtimestamp(now)
    if at.date() == start.date():
        return at.strftime("%H:%M")
    return at.strftime("%a %H:%M") if (at.date() - start.date()).days < 7 else at.strftime("%Y-%m-%d")


def plan_table(plans: Iterable[types_pb2.Plan], title: str = "Plans", chosen: types_pb2.Plan | None = None,
               limit: int | None = None, now: float | None = None) -> Table:
    """Ranked plans. ``$`` is each plan's cost_usd; ``now`` adds FINISH BY (a start at ``now`` plus the
    predicted completion)."""
    table = Table(title=title, title_justify="left")
    for col, just in [("#", "right"), ("GPU", "left"), ("GPUs", "right"), ("TP", "right"), ("PP", "right"),
                      ("DP", "right"), ("ZeRO", "right"), ("MB", "right"), ("GA", "right"), ("RECOMP", "left"),
                      ("PEAK/GPU GiB", "right"), ("OF GiB", "right"), ("STEP", "right"), ("GPU-h", "right"),
                      ("$", "right"), *((("FINISH BY", "right"),) if now is not None else ())]:
        table.add_column(col, justify=just)
    if chosen is not None:
        table.add_column("CHOSEN", justify="center")
    for i, p in enumerate(plans):
        if limit is not None and i >= limit:
            break
        lay = p.layout
        row = [str(p.rank or i + 1), p.gpu_type, str(p.num_gpus), str(lay.tp), str(lay.pp), str(lay.dp),
               str(lay.zero_stage), str(lay.micro_batch), str(lay.grad_accum), lay.recompute or "none",
               gib(p.peak_bytes_per_gpu), gib(p.gpu_memory_bytes), duration(p.step_time_s), f"{p.gpu_hours:.2f}",
               money(p.cost_usd)]
        if now is not None:
            row.append(finish_by(p.completion_s, now))
        if chosen is not None:
            same = (p.gpu_type == chosen.gpu_type and p.num_gpus == chosen.num_gpus
                    and p.layout == chosen.layout)
            row.append("[green]✔[/]" if same else "")
        table.add_row(*row)
    return table


def memory_table(plan: types_pb2.Plan) -> Table:
    m = plan.memory
    phase = f", peak in {m.phase}" if m.phase else ""
    table = Table(title=f"Memory per GPU ({plan.gpu_type}{phase})", title_justify="left")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    for name in ("parameters", "gradients", "optimizer_states", "activations", "logits", "buffers", "transient"):
        table.add_row(name.replace("_", " "), gib(getattr(m, name)))
    if m.peak_allocated:
        table.add_row("[bold]peak allocated[/] (live tensors)", f"[bold]{gib(m.peak_allocated)}[/]")
    table.add_row("allocator fragmentation", gib(m.fragmentation))
    table.add_row("runtime reserve (CUDA context, NCCL)", gib(m.runtime_reserve))
    table.add_row("[bold]device total[/] (nvidia-smi)", f"[bold]{gib(m.total)}[/]")
    table.add_row(f"headroom of {gib(plan.gpu_memory_bytes)}", gib(plan.headroom_bytes))
    return table


def jobs_table(jobs: Iterable[types_pb2.Job], all_users: bool = False, now: float | None = None) -> Table:
    """The jobs listing. A USER column when the listing may hold several users' jobs (``all_users``:
    an admin's listing) or does hold them, so a shared table never hides whose job is whose."""
    rows = list(jobs)
    show_user = all_users or len({j.user for j in rows}) > 1
    table = Table(title="Jobs", title_justify="left")
    cols = ("ID", "NAME", *(("USER",) if show_user else ()), "MODEL", "STATE", "PRIO", "PLAN", "NODES", "SUBMITTED",
            "REASON")
    for col in cols:
        table.add_column(col, justify="right" if col == "PRIO" else "left")
    for j in rows:
        plan = f"{j.plan.num_gpus} x {j.plan.gpu_type}" if j.HasField("plan") else "-"
        nodes = ",".join(a.node for a in j.placement) or "-"
        reason = j.pending_reason if state_name(j.state) == "PENDING" else ""
        user = (user_text(j.user or "-"),) if show_user else ()
        table.add_row(user_text(j.id), user_text(j.spec.name), *user, user_text(j.model_name), styled_state(j.state),
                      str(j.spec.priority), user_text(plan), user_text(nodes), when(j.submitted_at, now=now),
                      user_text(reason))
    return table


TERMINAL_STATE_NAMES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def job_times(job: types_pb2.Job, now: float | None = None) -> tuple[float, float, float]:
    """``(started, ended, ran)`` from the job's history: when it first ran (0: never), when it ended
    (0: not yet), and the seconds it spent RUNNING over all its attempts (up to ``now`` while it
    runs), so a requeued job's time back in the queue is not counted as run time."""
    now = time.time() if now is None else now
    started = ended = ran = 0.0
    running_since = None
    for h in job.history:
        name = state_name(h.state)
        if running_since is not None:
            ran += max(0.0, h.at - running_since)
            running_since = None
        if name == "RUNNING":
            started = started or h.at
            running_since = h.at
        elif name in TERMINAL_STATE_NAMES:
            ended = h.at
    if running_since is not None:
        ran += max(0.0, now - running_since)
    return started, ended, ran


def job_facts(job: types_pb2.Job, now: float | None = None) -> list[str]:
    """Who ran what, where from and when, as rich markup lines for `frenzy job ID`: the user, the
    command, the code (its sha256, or the working directory on the nodes), and submitted, started,
    ended and run time."""
    import shlex

    started, ended, ran = job_times(job, now)
    times = [f"submitted {when_full(job.submitted_at)}"]
    if started:
        times.append(f"started {when_full(started)} (queued {duration(max(0.0, started - job.submitted_at))})")
    else:
        times.append("started -")
    if ended:
        times.append(f"ended {when_full(ended)}")
    times.append(f"ran {duration(ran)}" if started else "ran -")
    spec = job.spec
    if spec.code_sha256:
        code = f"code: sha256 {user_text(spec.code_sha256[:12])} (uploaded at submit; each node runs it in its own copy)"
    elif spec.workdir:
        code = f"workdir: {user_text(spec.workdir)} (on the nodes)"
    else:
        code = "workdir: the agent's own directory (no code uploaded, no --workdir)"
    command = user_text(shlex.join(spec.command)) if spec.command else "-"
    return [f"user {user_text(job.user or '-')}  " + "  ".join(times), f"command: {command}", code]


def history_table(job: types_pb2.Job) -> Table:
    table = Table(title=f"State history of {user_text(job.id)}", title_justify="left")
    table.add_column("AT")
    table.add_column("+S", justify="right")
    table.add_column("STATE")
    table.add_column("REASON")
    t0 = job.history[0].at if job.history else 0.0
    for h in job.history:
        table.add_row(when(h.at), f"{h.at - t0:.2f}", styled_state(h.state), user_text(h.reason))
    return table


def layout_text(lay: types_pb2.Layout) -> str:
    """``"tp2 pp1 dp4 z1 mb2 rc=full"``: a layout in one short cell."""
    text = f"tp{lay.tp} pp{lay.pp} dp{lay.dp} z{lay.zero_stage} mb{lay.micro_batch}"
    return text + (f" rc={lay.recompute}" if lay.recompute and lay.recompute != "none" else "")


def cause_text(cause: str) -> str:
    """A recorded cause as a user reads it (``"oom"`` -> ``"out of memory"``)."""
    return "out of memory" if cause == "oom" else cause


def attempts_table(job: types_pb2.Job) -> Table:
    """Each attempt: the plan it ran with, MARP's predicted peak per GPU against the observed one,
    and how it ended (exit code, cause)."""
    table = Table(title=f"Attempts of {user_text(job.id)}", title_justify="left")
    for col, just in [("#", "right"), ("PLAN", "left"), ("LAYOUT", "left"), ("PREDICTED GiB", "right"),
                      ("OBSERVED GiB", "right"), ("EXIT", "right"), ("CAUSE", "left"), ("OUTCOME", "left")]:
        table.add_column(col, justify=just)
    for a in job.attempts:
        observed = gib(a.observed_peak_bytes) if a.observed_peak_bytes else "-"
        ended = a.outcome not in ("", "running")
        table.add_row(str(a.attempt), f"{a.num_gpus} x {user_text(a.gpu_type)}", layout_text(a.layout),
                      f"{gib(a.predicted_peak_bytes)} / {gib(a.gpu_memory_bytes)}", observed,
                      str(a.exit_code) if ended and a.cause else "", user_text(cause_text(a.cause)),
                      user_text(a.outcome))
    return table


def failure_lines(job: types_pb2.Job) -> list[str]:
    """Why a FAILED job failed, as rich markup lines: the reason, the recognised cause and the last
    output lines of the attempt that failed (what the agent sent with its exit); empty when the job
    did not fail."""
    if state_name(job.state) != "FAILED":
        return []
    out = []
    if job.history:
        out.append(f"[red]failed:[/] {user_text(job.history[-1].reason)}")
    last = job.attempts[-1] if job.attempts else None
    if last is not None and last.cause:
        where = f" on node {user_text(last.node)}" if last.node else ""
        # A launch failure's 127 is a count, not the command's status: it never ran.
        how = "never started" if last.cause.startswith("launch failed") else f"exit code {last.exit_code}"
        out.append(f"[red]cause:[/] {user_text(cause_text(last.cause))}{where} (attempt {last.attempt}, {how})")
    if last is not None and last.tail:
        out.append(f"last {len(last.tail)} lines of its output (all of it: frenzy logs {user_text(job.id)}):")
        out.extend("  " + user_text(line) for line in last.tail)
    return out


def nodes_table(nodes: Iterable[types_pb2.Node], now: float | None = None) -> Table:
    """Every node's GPUs: type, memory used/total, utilization, health (with the reason) and the holding job.

    A GPU held by no job but with processes on it is marked: memory the scheduler
    did not hand out (the free memory it plans with already excludes it)."""
    import time

    now = time.time() if now is None else now
    table = Table(title="Nodes", title_justify="left")
    for col, just in [("NODE", "left"), ("STATE", "left"), ("GPU", "right"), ("TYPE", "left"),
                      ("MEM USED/TOTAL GiB", "right"), ("UTIL", "right"), ("HEALTH", "left"), ("JOB", "left")]:
        table.add_column(col, justify=just)
    for n in nodes:
        if n.alive:
            state = "[green]alive[/]"
        elif n.declared_dead_at:
            state = f"[red]dead[/] (since {when(n.declared_dead_at)})"
        else:
            state = f"[red]no heartbeat[/] {max(0.0, now - n.heartbeat_at):.0f} s" if n.heartbeat_at else "[red]dead[/]"
        if n.draining:
            state += " [yellow]draining[/]"
        if n.health_reason:
            state += f"\n[red]{user_text(n.health_reason)}[/]"
        for i, g in enumerate(n.gpus):
            kind = user_text(g.gpu_type or g.nvml_name or "?")
            if g.type_from_memory:
                kind = f"{user_text(g.gpu_type)} (by memory: {user_text(g.nvml_name)})"
            health = "ok" if g.healthy else "[red]unhealthy[/]" + (
                f": {user_text(g.health_reason)}" if g.health_reason else "")
            job = user_text(g.owner) or "-"
            if not g.owner and g.processes:
                job = f"[yellow]{len(g.processes)} foreign process(es)[/]"
            table.add_row(user_text(n.name) if i == 0 else "", state if i == 0 else "", str(g.index), kind,
                          f"{gib(g.memory_total - g.memory_free)}/{gib(g.memory_total)}",
                          f"{g.utilization_pct}%" if g.utilization_pct >= 0 else "-", health, job)
        if not n.gpus:
            table.add_row(user_text(n.name), state, "-", "-", "-", "-", "-", "-")
    return table


def to_dict(msg) -> dict:  # noqa: ANN001 - any protobuf message
    """The one JSON dialect of Frenzy's outputs (see frenzy.rpc.protojson)."""
    return to_json(msg)


class SafeConsole(Console):
    """A rich Console that never writes a control character it was handed, nor a hyperlink.

    Every string it renders (``print`` arguments, table cells) passes through ``render_str``:
    control characters become visible escapes before markup is parsed (Frenzy's own markup
    has none), and a string whose markup does not parse (a job name like ``[/x]``) is
    printed as it is instead of failing the command."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        clean = plain_text(text, keep_lines=True)
        try:
            rendered = super().render_str(clean, **kwargs)
        except MarkupError:
            rendered = super().render_str(escape(clean), **kwargs)
        # [link=...] in a user's string would emit an OSC 8 escape sequence: Frenzy prints no links.
        rendered.spans = [Span(sp.start, sp.end, _without_link(sp.style)) for sp in rendered.spans]
        return rendered


def _without_link(style: str | Style) -> str | Style:
    try:
        parsed = Style.parse(style) if isinstance(style, str) else style
    except StyleSyntaxError:
        return style  # not a style: rendered as none
    return parsed.update_link(None) if parsed.link else style


def console(stderr: bool = False) -> Console:
    # Tables are wide; when output is piped (CI, logs) rich would assume 80
    # columns and fold every cell, so give it room instead.
    probe = Console(stderr=stderr)
    width = None if probe.is_terminal else 160
    return SafeConsole(stderr=stderr, highlight=False, width=width)
