"""``frenzy logs JOB``: a job's output (every node's stdout and stderr), live with ``--follow``.

The agents ship each node's log file into that node's Redis log stream of the job; the
scheduler serves them merged in time order (``StreamLogs``), so this works from any machine
that reaches the scheduler. Lines are prefixed with their node when the job ran
on more than one node or attempt. Each node's stream is capped in bytes (issue 34 item 6; the
scheduler sends the caps with the stream): when its start was dropped, a note on stderr
says how many bytes and what the caps are; the node's log file (path shown by ``frenzy
job``) keeps more. Output a node's file cap dropped shows in place, as a line saying so.
``OutputWriter`` prints the chunks here and in ``frenzy submit --wait``.
"""

from __future__ import annotations

import sys
from typing import Annotated

import grpc
import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, SchedulerOpt, echo_json, rpc_fail
from frenzy.rpc.client import scheduler_stub
from frenzy.v1 import scheduler_pb2

# StreamLogs' initial metadata (frenzy.scheduler.service.LOG_CAP_HEADER, LOG_FILE_CAP_HEADER)
LOG_CAP_HEADER = "frenzy-log-cap-bytes"
LOG_FILE_CAP_HEADER = "frenzy-log-file-cap-bytes"


def logs(
    job_id: Annotated[str, typer.Argument(help="Job id (see frenzy jobs).")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    node: Annotated[str, typer.Option(help="Only this node's output.")] = "",
    attempt: Annotated[int, typer.Option(min=0, help="Only this attempt (0: all).")] = 0,
    tail: Annotated[int, typer.Option(min=0, help="Start with the last N lines (0: from the start).")] = 0,
    prefix: Annotated[bool | None, typer.Option(
        "--prefix/--no-prefix", help="Prefix lines with node (and attempt). Default: when there are several.")]
    = None,
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Print a job's output from every node; --follow streams it live until the job ends.

    \b
    Examples:
      frenzy logs job-3f2a9c1e0b7d            # everything the stream holds
      frenzy logs job-3f2a9c1e0b7d -f         # live; exits 0 if the job SUCCEEDED, else 1
      frenzy logs job-3f2a9c1e0b7d --node gpu-7 --tail 50
    """
    request = scheduler_pb2.StreamLogsRequest(job_id=job_id, follow=follow, node=node, attempt=attempt,
                                              tail_lines=tail)
    try:
        with scheduler_stub(scheduler) as stub:
            job = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30)
            if prefix is None:
                prefix = len(job.placement) > 1 or job.attempt > 1
            call = stub.StreamLogs(request)
            out = OutputWriter(prefix=prefix, attempt_tags=job.attempt > 1, log_paths=dict(job.log_paths),
                               trimmed_notes=not tail, caps=log_caps(call))
            for chunk in call:
                if as_json:
                    echo_json(render.to_dict(chunk))
                    continue
                out.write(chunk)
            out.end_line()
            if follow:
                final = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30)
                state = render.state_name(final.state)
                if not as_json:
                    render.console(stderr=True).print(f"{job_id}: {render.styled_state(final.state)}")
                if state != "SUCCEEDED":
                    raise typer.Exit(1)
    except grpc.RpcError as exc:
        rpc_fail(exc)


def log_caps(call: object) -> tuple[int, int]:
    """(the stream's byte cap, a node's log file cap) a StreamLogs call announced (0: none or unknown)."""
    try:
        meta = dict(call.initial_metadata() or ())  # type: ignore[attr-defined]
    except (AttributeError, grpc.RpcError):
        return 0, 0
    out = []
    for name in (LOG_CAP_HEADER, LOG_FILE_CAP_HEADER):
        raw = meta.get(name, "0")
        out.append(int(raw) if isinstance(raw, str) and raw.isdigit() else 0)
    return out[0], out[1]


def _size(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


class OutputWriter:
    """A job's log chunks on stdout, as the job printed them (``frenzy logs`` and ``frenzy submit --wait``).

    Pieces of one node's line are joined; another node's piece never glues onto an unfinished
    line; with ``prefix`` each line starts with ``[node]`` (``[node #attempt]`` with
    ``attempt_tags``). Control characters other than newline and tab are shown as escapes
    (``\\x1b``, render.plain_text): the output is the job's, and an escape sequence in it must not
    retitle, clear or rewrite the reader's terminal (issue 14 item 12). A node whose stream
    start was trimmed gets a note on stderr naming its log file (``log_paths``) and the caps
    (``caps``: the stream's and a node's file's, bytes, 0 unknown)."""

    def __init__(self, prefix: bool = False, attempt_tags: bool = False, log_paths: dict[str, str] | None = None,
                 trimmed_notes: bool = True, caps: tuple[int, int] = (0, 0)) -> None:
        self.prefix, self.attempt_tags, self.trimmed_notes = prefix, attempt_tags, trimmed_notes
        self.caps = caps
        self.log_paths = log_paths or {}
        self.seen: set[tuple[str, int]] = set()
        self.open_line: tuple[str, int] | None = None  # whose last line is still unfinished
        self.trimmed = False  # some node's output began before what the stream held

    def write(self, chunk: scheduler_pb2.LogChunk) -> None:
        where = (chunk.node, chunk.attempt)
        if where not in self.seen:
            self.seen.add(where)
            if chunk.offset > 0:
                self.trimmed = True
                if self.trimmed_notes:
                    self.end_line()
                    path = self.log_paths.get(chunk.node, "its log file")
                    cap, file_cap = self.caps
                    kept = f" (it keeps the newest {_size(cap)} of a node's output)" if cap else ""
                    file = (f"the log file {render.user_text(path)} on {render.user_text(chunk.node)} keeps the "
                            f"newest {_size(file_cap)}" if file_cap else
                            f"the full log is {render.user_text(path)} on {render.user_text(chunk.node)}")
                    render.console(stderr=True).print(
                        f"[yellow]({render.user_text(chunk.node)} attempt {chunk.attempt}: the first {chunk.offset} "
                        f"bytes were dropped from the log stream{kept}; {file})[/]")
        text = render.plain_text(chunk.text, keep_lines=True)
        if not text:
            return
        continues = self.open_line == where  # this piece finishes a line the last one began
        if self.open_line is not None and not continues:
            sys.stdout.write("\n")  # another node's output: do not glue it onto that line
        if self.prefix:
            tag = f"[{render.plain_text(chunk.node)}{f' #{chunk.attempt}' if self.attempt_tags else ''}] "
            lines = text.split("\n")
            body = lines[:-1] if text.endswith("\n") else lines
            tagged = "".join(("" if i == 0 and continues else tag) + line + "\n" for i, line in enumerate(body))
            text = tagged if text.endswith("\n") else tagged[:-1]
        self.open_line = None if text.endswith("\n") else where
        sys.stdout.write(text)
        sys.stdout.flush()

    def end_line(self) -> None:
        """Finish an unfinished output line, so what is printed next starts on a line of its own."""
        if self.open_line is not None:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.open_line = None

PANEL = "Run jobs"


def register(app: typer.Typer) -> None:
    app.command("logs", rich_help_panel=PANEL)(logs)
