"""The user's job commands: ``jobs``, ``job``, ``cancel``, ``nodes``.

Each talks to the Scheduler over gRPC (``scheduler_call``: one way to report its errors) and
renders what comes back (``frenzy.cli.render``); ``--json`` prints the same records the REST
gateway serves.
"""

from __future__ import annotations

from typing import Annotated

import grpc
import typer

from frenzy.cli import render
from frenzy.cli.output import EXIT_ALREADY_ENDED, JsonOpt, SchedulerOpt, echo_json, fail, scheduler_call
from frenzy.rpc.job_json import job_list
from frenzy.v1 import scheduler_pb2, types_pb2

PANEL = "Run jobs"


def jobs(
    state: Annotated[list[str] | None, typer.Option(help="Only jobs in this state (repeat).")] = None,
    user: Annotated[str, typer.Option(help="Only this user's jobs (admins: anyone's; others: only their own).",
                                      show_default=False)] = "",
    name: Annotated[str, typer.Option(help="Only jobs whose name contains this (ignoring case).",
                                      show_default=False)] = "",
    since: Annotated[str, typer.Option(help="Only jobs submitted since then: 30m, 2h, 7d, or a date "
                                            "(2026-11-28, 2026-11-28T14:03, local time).", show_default=False)] = "",
    limit: Annotated[int, typer.Option(min=1, help="At most this many jobs (counted after the filters).")] = 50,
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first, with the pending reason of waiting jobs.

    Yours, or every user's with an admin token (then with a USER column). The scheduler applies
    the filters, so --limit counts matching jobs.

    \b
    Examples:
      frenzy jobs --state running --state pending
      frenzy jobs --since 2h --name llama      # names containing "llama", submitted in the last 2 hours
      frenzy jobs --user alice                 # an admin looking at alice's jobs
    """
    from frenzy.rpc.listing import since_time

    states = []
    for s in state or []:
        try:
            states.append(types_pb2.JobState.Value(f"JOB_STATE_{s.upper()}"))
        except ValueError:
            fail(f"--state: unknown state {s!r}; one of PENDING RESERVED LAUNCHING RUNNING SUCCEEDED FAILED "
                 "CANCELLED", 2)
    try:
        since_at = since_time(since)
    except ValueError as exc:
        fail(f"--since: {exc}", 2)
    req = scheduler_pb2.ListJobsRequest(states=states, limit=limit, user=user, name=name, since=since_at)
    with scheduler_call(scheduler) as stub:
        resp = stub.ListJobs(req, timeout=30)
    if as_json:  # the same rows as GET /api/jobs (frenzy.rpc.job_json)
        echo_json(job_list(resp.jobs))
    else:
        render.console().print(render.jobs_table(resp.jobs, all_users=resp.all_users))


def job(
    job_id: Annotated[str, typer.Argument(help="Job id (see frenzy jobs).")],
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Show one job: its plan, placement, state history and the last lines of its output."""
    with scheduler_call(scheduler) as stub:
        j = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30)
        if as_json:
            echo_json(render.to_dict(j))
            return
        chunks = list(stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, tail_lines=JOB_TAIL_LINES),
                                      timeout=30))
    show_job(j)
    show_output_tail(j, chunks)


JOB_TAIL_LINES = 20  # enough to show a traceback's end; `frenzy logs` has the rest


def show_output_tail(j: types_pb2.Job, chunks: list[scheduler_pb2.LogChunk]) -> None:
    """The job's last output lines as the log stream holds them, tagged with their node when the
    job ran on several nodes or attempts, so a failure's cause shows without a second command."""
    con = render.console()
    text_chunks = [c for c in chunks if c.text]
    if not text_chunks:
        con.print("output: no output yet")
        return
    tagged = len({(c.node, c.attempt) for c in text_chunks}) > 1
    con.rule(f"last {JOB_TAIL_LINES} lines of output (all of it: frenzy logs {j.id})")
    for c in text_chunks:
        tag = f"[{c.node}{'' if j.attempt <= 1 else f' #{c.attempt}'}] " if tagged else ""
        for line in c.text.rstrip("\n").split("\n"):
            con.print(render.user_text(tag + line), highlight=False)  # job output: escapes shown, not run


def show_job(j: types_pb2.Job, plans_limit: int = 8) -> None:
    con = render.console()
    attempts = f"attempt {j.attempt}" + (f" of {j.max_attempts}" if j.max_attempts else "")
    con.print(f"[bold]{j.id}[/] {render.user_text(j.spec.name)}  model {render.user_text(j.model_name)} ({j.parameter_count / 1e9:.3f} B)  "
              f"state {render.styled_state(j.state)}  {attempts}  priority {j.spec.priority}")
    for line in render.job_facts(j):
        con.print(line, soft_wrap=True)
    if render.state_name(j.state) == "PENDING" and j.pending_reason:
        con.print(f"[yellow]pending:[/] {render.user_text(j.pending_reason)}")
    last = j.attempts[-1] if j.attempts else None
    if j.failed_node and last is not None and last.cause.startswith("launch failed"):
        # Its 127 is a count: the command never ran (the cause below says why).
        con.print(f"[red]failed:[/] node {j.failed_node} (torchrun node rank {j.failed_node_rank}) could not start "
                  f"the job. Its log: frenzy logs {j.id} --node {j.failed_node}")
    elif j.failed_node:
        con.print(f"[red]failed:[/] node {j.failed_node} (torchrun node rank {j.failed_node_rank}) exited with "
                  f"code {j.failed_exit_code}. To see why: frenzy logs {j.id} --node {j.failed_node}")
    if render.state_name(j.state) == "FAILED" and last is not None and last.cause:
        con.print(f"[red]cause:[/] {render.user_text(render.cause_text(last.cause))}"
                  + (f" on node {render.user_text(last.node)}" if last.node else "") + f" (attempt {last.attempt})")
    if j.candidate_plans:
        con.print(render.plan_table(j.candidate_plans, title="Candidate plans",
                                    chosen=j.plan if j.HasField("plan") else None, limit=plans_limit))
    if j.HasField("plan"):
        con.print(render.memory_table(j.plan))
    if j.placement:
        rdzv = f"  rendezvous {j.master_addr}:{j.master_port}" if j.master_port else ""
        con.print("placement: " + "; ".join(f"{a.node} GPUs {list(a.gpu_indices)}" for a in j.placement) + rdzv)
    con.print(render.history_table(j))
    if j.attempts:
        con.print(render.attempts_table(j))
    for node, path in sorted(j.log_paths.items()):
        con.print(f"log ({render.user_text(node)}): {render.user_text(path)}")
    if j.exit_codes:
        con.print("exit codes: " + ", ".join(f"{n}={c}" for n, c in sorted(j.exit_codes.items())))


def cancel(
    job_id: str,
    reason: Annotated[str, typer.Option()] = "requested by user",
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job: a pending job leaves the queue, a running one is stopped on every node.

    A job that already ended is left as it is: exit 0 if it is CANCELLED (cancelling twice is
    harmless), 5 if it SUCCEEDED or FAILED (it ended some other way)."""
    with scheduler_call(scheduler) as stub:
        try:
            resp = stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason), timeout=30)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            _already_ended(stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30), as_json)
    if as_json:
        echo_json(render.to_dict(resp.job))
    else:
        render.console().print(f"{job_id}: {render.styled_state(resp.job.state)} (cancel requested)")


def _already_ended(j: types_pb2.Job, as_json: bool) -> None:
    """The scheduler refused the cancel because the job had ended: say how, and exit 0 only when
    the job is CANCELLED, so `cancel` can be repeated safely in scripts."""
    state = render.state_name(j.state)
    if as_json:
        echo_json(render.to_dict(j))
    render.console(stderr=as_json).print(f"{j.id}: already ended: {render.styled_state(j.state)} (nothing to cancel)")
    raise typer.Exit(0 if state == "CANCELLED" else EXIT_ALREADY_ENDED)


def nodes(
    include_dead: Annotated[bool, typer.Option("--all", help="Include nodes whose heartbeat expired.")] = False,
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Show the cluster: each node's GPUs with type, memory and the job holding them."""
    with scheduler_call(scheduler) as stub:
        resp = stub.ListNodes(scheduler_pb2.ListNodesRequest(include_dead=include_dead), timeout=30)
    if as_json:
        echo_json([render.to_dict(n) for n in resp.nodes])
    else:
        render.console().print(render.nodes_table(resp.nodes))


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel=PANEL)(jobs)
    app.command(rich_help_panel=PANEL)(job)
    app.command(rich_help_panel=PANEL)(cancel)
    app.command(rich_help_panel=PANEL)(nodes)
