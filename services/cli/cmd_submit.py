"""``frenzy submit`` and ``frenzy watch``: send a job (its code packed and uploaded first) and
follow it to its end.

The job entry is built and checked by the one pydantic model every front door uses
(``frenzy.rpc.jobspec``), so a bad flag is reported here exactly as REST and the batch file
report it; the model is checked too before any code is packed or sent.

Everything from the command's first word on is the job's (``sbatch script args``):
``frenzy submit --model m ... python train.py --name x`` gives ``--name x`` to train.py. ``--wait``
streams the job's output (``StreamLogs``) with its state changes (``WatchJob``) until it ends and
exits with its outcome, as ``ray job submit`` does; Ctrl-C stops following, never the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple, cast

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, SchedulerOpt, echo_json, fail, rpc_fail, scheduler_call
from frenzy.v1 import scheduler_pb2, types_pb2

if TYPE_CHECKING:
    from rich.console import Console

PANEL = "Run jobs"
ORDER = 10  # submit first in its panel of `frenzy --help`


def submit(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="Catalog name, config.json path, or inline JSON.")],
    seq_len: Annotated[int, typer.Option()],
    global_batch: Annotated[int, typer.Option()],
    micro_batch: Annotated[int, typer.Option(help="0: planner chooses.")] = 0,
    precision: Annotated[str, typer.Option()] = "bf16",
    optimizer: Annotated[str, typer.Option()] = "adamw",
    train_steps: Annotated[int, typer.Option()] = 1000,
    name: Annotated[str, typer.Option(help="A label for the job.")] = "",
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE for the job's environment (repeat).")] = None,
    workdir: Annotated[str, typer.Option(help="Working directory on the nodes (a shared filesystem); the "
                                          "code is not packed then.")] = "",
    no_code: Annotated[bool, typer.Option("--no-code", help="Do not pack the directory: the command runs in "
                                          "the agent's own directory (or --workdir).")] = False,
    code_dir: Annotated[Path, typer.Option(help="The directory to pack and run in (git-aware: what git would "
                                           "commit).")] = Path("."),
    max_code_mib: Annotated[float, typer.Option(min=0.001, help="Refuse to pack more than this many MiB.")] = 100.0,
    gpu_types: Annotated[list[str] | None, typer.Option("--gpu-type", help="Only these GPU types.")] = None,
    max_gpus: Annotated[int, typer.Option(help="At most this many GPUs (0: no limit).")] = 0,
    min_gpus: Annotated[int, typer.Option(help="At least this many GPUs (0: no minimum); with --max-gpus "
                                          "the same, a fixed world size.")] = 0,
    idempotency_key: Annotated[str, typer.Option(help="Same key, same job (safe retries).")] = "",
    max_oom_retries: Annotated[int | None, typer.Option(
        min=0, max=10, help="Re-plans after out-of-memory exits, each on a plan with more memory per GPU "
                            "[default: 2].")] = None,
    priority: Annotated[int, typer.Option(
        help="-100..100; higher starts first (0: normal). Above the scheduler's --max-user-priority "
             "(default 0) only with an admin token.")] = 0,
    resumable: Annotated[bool, typer.Option(
        help="The command saves checkpoints and resumes from the latest when started again: the scheduler "
             "may stop it once (SIGTERM, then SIGKILL after the agents' grace) for waiting jobs much shorter "
             "than what it has left, and start it again later; the stop does not count as an attempt.")] = False,
    objective: Annotated[str, typer.Option(help="time | cost | gpu-hours: what the plan minimises among those "
                                           "that fit (cost: GPUs x price per GPU-hour x runtime; docs/cost.md).")
                         ] = "time",
    deadline: Annotated[str | None, typer.Option(help="The job must finish within this long of its submission, "
                                                 "e.g. 12h, 90m, 1h30m, 2d; plans that cannot are dropped.")
                        ] = None,
    budget: Annotated[str | None, typer.Option(help="Dollars the job may cost at most (e.g. 250); dearer plans "
                                               "are dropped.")] = None,
    wait: Annotated[bool, typer.Option(help="Print the job's state changes and output until it ends; exit 0 if it "
                                       "SUCCEEDED, else 1. Ctrl-C stops following, not the job.")] = False,
    finetune: Annotated[str, typer.Option(help="full | lora | qlora (planned as it will run).")] = "full",
    lora_rank: Annotated[int, typer.Option(help="Rank of the LoRA / QLoRA adapters.")] = 16,
    lora_targets: Annotated[str, typer.Option(help="Linears with adapters, e.g. q,k,v,o,gate,up,down.")] = "",
    lora_dropout: Annotated[float, typer.Option(help="peft's lora_dropout on the adapters' inputs, in [0, 1).")
                            ] = 0.0,
    lora_adapter_dtype: Annotated[str, typer.Option(help="fp32 | compute: the adapters' dtype (peft: fp32, "
                                                    "torchtune: the base's).")] = "fp32",
    fsdp_reshard: Annotated[str, typer.Option(help="keep-last | all: FSDP2 blocks resharded after their forward "
                                              "(torchtitan: keep-last, torchtune: all).")] = "keep-last",
    qlora_backend: Annotated[str, typer.Option(help="bitsandbytes | torchao: QLoRA's NF4 base (peft: bitsandbytes, "
                                               "torchtune: torchao).")] = "bitsandbytes",
    main_grad_dtype: Annotated[str, typer.Option(help="fp32 | half: Megatron's main-grad buffer under --precision "
                                                 "fp16 / bf16 (half: --fp16's default).")] = "fp32",
    weight_decay: Annotated[float | None, typer.Option(help="Optimizer weight decay (default: the "
                                                         "optimizer's own).")] = None,
    ep: Annotated[int, typer.Option(help="Expert-parallel degree (mixture-of-experts models).")] = 1,
    etp: Annotated[int | None, typer.Option(help="Expert-tensor-parallel degree (default: tp).")] = None,
    pp_layers: Annotated[str, typer.Option(help="Layers of each pipeline (or virtual) stage, e.g. "
                                                "2,4,4,2.")] = "",
    compiled: Annotated[bool, typer.Option("--compile", help="The model runs under torch.compile.")] = False,
    float8: Annotated[bool, typer.Option("--float8", help="Float8 linears (GPUs with fp8 only).")] = False,
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Submit a job: Frenzy's options (the model and recipe), then the command and its arguments.

    Everything from the command's first word on is the job's, as with `sbatch script args`: in
    `frenzy submit --model gpt2-124m --seq-len 1024 --global-batch 32 python train.py --name run1`,
    `--name run1` goes to train.py. So Frenzy's own options (--wait, --name, ...) come before the
    command; a `--` before the command works too.

    The recipe flags (--finetune, --lora-*, --ep, --etp, --pp-layers, --compile, --float8,
    --weight-decay, --fsdp-reshard, --qlora-backend) are those of `frenzy predict`: the job is
    planned the way it will run.

    The current directory travels with the job (what git would commit, at most --max-code-mib):
    each node runs the command in a fresh copy of it. --workdir (a directory on the nodes) or
    --no-code runs it without packing.

    --wait streams the job's output and state changes until it ends and exits with its outcome (0
    SUCCEEDED, else 1); with --json, stdout holds only the final job record. Ctrl-C stops
    following: the job keeps running (frenzy logs JOB --follow, frenzy cancel JOB).

        frenzy submit --model gpt2-124m --seq-len 1024 --global-batch 32 --wait python train.py --tp {tp}
    """
    from frenzy.rpc.jobspec import JobSpecError, parse_entry, unknown_model

    command = list(ctx.args)
    env_map: dict[str, str] = {}
    for item in env or []:
        if "=" not in item:
            fail(f"env: expected KEY=VALUE, got {item!r}", 2)
        k, v = item.split("=", 1)
        env_map[k] = v
    try:
        spec = parse_entry({"name": name, "model": model, "seq_len": seq_len, "global_batch": global_batch,
                            "micro_batch": micro_batch, "precision": precision, "optimizer": optimizer,
                            "train_steps": train_steps, "command": command, "env": env_map, "workdir": workdir,
                            "gpu_types": gpu_types or [], "max_gpus": max_gpus,
                            "min_gpus": min_gpus, "idempotency_key": idempotency_key,
                            "max_oom_retries": max_oom_retries, "priority": priority, "resumable": resumable,
                            "objective": objective, "deadline": deadline, "budget": budget,
                            **_recipe_flags(
                                finetune=finetune, lora_rank=lora_rank, lora_targets=lora_targets,
                                weight_decay=weight_decay, ep=ep, etp=etp, pp_layers=pp_layers, compile=compiled,
                                float8=float8, lora_dropout=lora_dropout, lora_adapter_dtype=lora_adapter_dtype,
                                fsdp_reshard=fsdp_reshard, qlora_backend=qlora_backend,
                                main_grad_dtype=main_grad_dtype)}).to_proto()
    except JobSpecError as exc:
        msg = str(exc)
        if msg.startswith("command"):
            msg += (". To fix: give the command last, e.g. `frenzy submit --model ... python train.py` "
                    "(or after `--`)")
        fail(msg, 2)
    # Before packing and uploading: a typo in --model must not cost an upload of the code first.
    why = unknown_model(spec.model)
    if why is not None:
        fail(f"--model: {why.split(': ', 1)[1] if why.startswith('model') else why}", 2)
    packed = None if (workdir or no_code) else _pack_code(code_dir, max_code_mib)
    with scheduler_call(scheduler) as stub:
        if packed is not None:
            spec.code_sha256 = _upload_code(stub, packed, quiet=as_json)
        resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=60)
        job = resp.job
        if as_json and not wait:
            echo_json(render.to_dict(resp))
            return
        # With --json, stdout holds the final record alone: what is said on the way goes to stderr.
        render.console(stderr=as_json).print(
            f"submitted [bold]{job.id}[/]{' (duplicate)' if resp.duplicate else ''}: "
            f"{render.user_text(job.model_name)}, {len(job.candidate_plans)} candidate plans; best "
            f"{job.candidate_plans[0].num_gpus} x {render.user_text(job.candidate_plans[0].gpu_type)}")
        if wait:
            followed = follow_job(stub, job.id, output=not as_json, state_console=render.console(stderr=as_json))
            job = followed.job
            if as_json:
                echo_json(render.to_dict(job))
            if render.state_name(job.state) != "SUCCEEDED":
                if not as_json:
                    show_failure(job, output_shown=followed.output_complete)
                raise typer.Exit(1)


def show_failure(j: types_pb2.Job, output_shown: bool = False) -> None:
    """What `--wait` adds under a failed job's last state line, which gave the reason already
    (render.failure_lines, less what was said): the cause the agent recognised unless the reason
    says it, and the last lines of the failing node's output (from its exit report: no second
    call) unless the whole output was just streamed."""
    if render.state_name(j.state) != "FAILED":
        return
    reason = j.history[-1].reason if j.history else ""
    cause = j.attempts[-1].cause if j.attempts else ""
    # "exit code 3" in "node a (node rank 0) failed with exit code 3", "command not found: 'x'" in
    # "... could not start the job: command not found: 'x'": the same words a second time.
    said = bool(cause) and render.cause_text(cause).removeprefix("launch failed: ") in reason
    con = render.console()
    for line in render.failure_lines(j):
        if line.startswith("[red]failed:[/]") or (said and line.startswith("[red]cause:[/]")):
            continue
        if output_shown and not line.startswith("[red]"):
            break  # the output's last lines: streamed above already
        con.print(line, highlight=False)
    if not output_shown and not (j.attempts and j.attempts[-1].tail):
        con.print(f"output: frenzy logs {j.id}")


def _pack_code(code_dir: Path, max_code_mib: float):  # noqa: ANN202 -> frenzy.code.pack.PackedCode
    """The submit directory packed (frenzy.code.pack), or the command ends naming what is wrong."""
    from frenzy.code.pack import PackError, pack

    try:
        return pack(code_dir, max_bytes=int(max_code_mib * 1024 * 1024))
    except PackError as exc:
        fail(str(exc), 2)


def _upload_code(stub, packed, quiet: bool) -> str:  # noqa: ANN001
    """Send the packed code unless the scheduler holds it already; its sha256 for the JobSpec."""
    from frenzy.code.pack import CodeTooLarge
    from frenzy.code.upload import ensure_uploaded

    try:
        sent = ensure_uploaded(stub, packed)
    except CodeTooLarge as exc:
        fail(str(exc), 2)
    con = render.console(stderr=quiet)
    how = "uploaded" if sent.sent else "already stored"
    con.print(f"code: {packed.files} files from {render.user_text(packed.root)}"
              f"{' (git)' if packed.git else ''}, {packed.size / 1024:.0f} KiB packed, {how} "
              f"({packed.sha256[:12]})", highlight=False)
    for note in packed.skipped[:10]:
        con.print(f"[yellow]code: left out[/] {render.user_text(note)}", highlight=False)
    return packed.sha256


class Followed(NamedTuple):
    job: types_pb2.Job  # as it ended
    output_complete: bool  # its whole output was streamed (none trimmed, the stream not lost)


# How long the output may keep coming after the job ended: the scheduler ends a followed log
# stream within about a second of the end (its last read); past this the stream is abandoned.
OUTPUT_AFTER_END_S = 10.0


def follow_job(stub, job_id: str, output: bool, state_console: Console | None = None) -> Followed:  # noqa: ANN001
    """Print ``job_id``'s state changes (``WatchJob``) and, with ``output``, its output
    (``StreamLogs`` with follow) until it ends; -> how it ended.

    Each stream is read by a thread of its own into one queue and printed from here, so a state
    line never lands inside an output line. The final state is printed after the last output
    (the log stream ends just after the job). Ctrl-C ends the command (exit 130), not the job,
    and says how to follow or cancel it."""
    import queue
    import threading
    import time

    import grpc

    from frenzy.cli.cmd_logs import OutputWriter

    con = state_console or render.console()
    events: queue.Queue[tuple[str, object]] = queue.Queue()
    calls = [stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id))]
    if output:
        calls.append(stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, follow=True)))

    def pump(kind: str, call: object) -> None:
        try:
            for item in call:  # type: ignore[attr-defined]  # a gRPC response stream
                events.put((kind, item))
            events.put((kind + "-end", None))
        except grpc.RpcError as exc:
            events.put((kind + "-error", exc))

    for kind, call in zip(("state", "output"), calls, strict=False):
        threading.Thread(target=pump, args=(kind, call), daemon=True, name=f"follow-{kind}").start()

    writer: OutputWriter | None = None
    watching, streaming, complete = True, output, output
    last: types_pb2.Job | None = None
    ending: types_pb2.StateTransition | None = None  # the final transition, printed after the output
    deadline = float("inf")
    received = printed = 0  # transitions the watch has sent; transitions printed (in history order)
    attempt = 0  # the latest attempt whose output has begun
    try:
        while watching or streaming:
            try:
                kind, item = events.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    calls[-1].cancel()  # the output stream outlived the job: stop waiting for it
                    streaming, complete = False, False
                continue
            if kind == "state":
                update = cast("scheduler_pb2.JobUpdate", item)
                last, t = update.job, update.transition
                received += 1
                if received <= printed:
                    continue  # printed already, from the job's history when its output began
                printed = received
                if render.state_name(t.state) in ("SUCCEEDED", "FAILED", "CANCELLED") and streaming:
                    ending = t
                    continue
                if writer is not None:
                    writer.end_line()
                _state_line(con, t)
            elif kind == "state-end":
                watching = False
                deadline = time.monotonic() + OUTPUT_AFTER_END_S
            elif kind == "state-error":
                rpc_fail(cast("grpc.RpcError", item))
            elif kind == "output":
                chunk = cast("scheduler_pb2.LogChunk", item)
                if writer is None or chunk.attempt > attempt:
                    # An attempt's first output: the job is placed, so its output is prefixed by node
                    # when it runs on more than one. The watch polls, so the output can come first:
                    # the states it has not told yet (RESERVED, RUNNING, ...) are printed from the
                    # history, before it.
                    attempt = chunk.attempt
                    placed = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30)
                    last = placed
                    if writer is not None:
                        writer.end_line()
                    for t in placed.history[printed:]:
                        if render.state_name(t.state) in ("SUCCEEDED", "FAILED", "CANCELLED"):
                            break  # the end is printed after the output
                        _state_line(con, t)
                        printed += 1
                    if writer is None:
                        writer = OutputWriter(log_paths=dict(placed.log_paths))
                    writer.prefix = writer.prefix or len(placed.placement) > 1
                    writer.log_paths.update(placed.log_paths)
                writer.write(chunk)
            elif kind == "output-end":
                streaming = False
            elif kind == "output-error":
                streaming, complete = False, False
                if writer is not None:
                    writer.end_line()
                exc = cast("grpc.RpcError", item)
                render.console(stderr=True).print(
                    f"[yellow]the job's output stream ended ({exc.code().name}: {render.user_text(exc.details())}); "
                    f"waiting for the job's end without it. Its output: frenzy logs {job_id}[/]")
    except KeyboardInterrupt:
        for call in calls:
            call.cancel()
        if writer is not None:
            writer.end_line()
        _still_running(stub, job_id, last)
        raise typer.Exit(130) from None
    if writer is not None:
        writer.end_line()
        complete = complete and not writer.trimmed
    if ending is not None:
        _state_line(con, ending)
    if last is None:
        last = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30)
    return Followed(last, complete)


def _state_line(con: Console, t: types_pb2.StateTransition) -> None:
    """One state change, dimmer than the job's own output around it."""
    con.print(f"[dim]{render.when(t.at)}[/]  {render.styled_state(t.state)}  [dim]{render.user_text(t.reason)}[/]")


def _still_running(stub, job_id: str, last: types_pb2.Job | None) -> None:  # noqa: ANN001
    """Ctrl-C while following: the job is the cluster's now; say so, and how to get back to it."""
    import grpc

    try:  # its state now (the watch may lag a little); a moment at most, the user wants out
        last = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=2)
    except (grpc.RpcError, KeyboardInterrupt):  # a second Ctrl-C: say it with what is known
        pass
    state = render.state_name(last.state) if last is not None else ""
    if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
        return
    doing = "stays queued" if state == "PENDING" else "keeps running"
    con = render.console(stderr=True)
    con.print(f"\nstopped following {job_id}; the job {doing} on the cluster.")
    con.print(f"  follow it:  frenzy logs {job_id} --follow   (state changes only: frenzy watch {job_id})")
    con.print(f"  cancel it:  frenzy cancel {job_id}")


def watch(job_id: str, scheduler: SchedulerOpt = "") -> None:
    """Follow a job's state changes until it ends (its output too: frenzy logs JOB --follow).

    Exits 0 if it SUCCEEDED, else 1; Ctrl-C stops watching, not the job (exit 130)."""
    with scheduler_call(scheduler) as stub:
        j = follow_job(stub, job_id, output=False).job
    raise typer.Exit(0 if render.state_name(j.state) == "SUCCEEDED" else 1)


def _recipe_flags(**flags: object) -> dict[str, object]:
    """The recipe flags given (not at their defaults), as JobEntry fields: an unset flag keeps the
    entry's own default (and its validation names the field when a value is wrong)."""
    defaults = {"finetune": "full", "lora_rank": 16, "lora_targets": "", "weight_decay": None, "ep": 1, "etp": None,
                "pp_layers": "", "compile": False, "float8": False, "lora_dropout": 0.0, "lora_adapter_dtype": "fp32",
                "fsdp_reshard": "keep-last", "qlora_backend": "bitsandbytes", "main_grad_dtype": "fp32"}
    out: dict[str, object] = {k: v for k, v in flags.items() if v != defaults.get(k)}
    if isinstance(out.get("lora_targets"), str):
        out["lora_targets"] = [t.strip() for t in str(out["lora_targets"]).split(",") if t.strip()]
    return out


def register(app: typer.Typer) -> None:
    # The first word that is not an option starts the job's command, and everything after it is the
    # command's (`sbatch script args`): `... python train.py --name x` gives --name to train.py.
    # An unknown option before the command is an error, not the start of a command.
    app.command(context_settings={"allow_extra_args": True, "allow_interspersed_args": False},
                options_metavar="[OPTIONS] [--] COMMAND [ARGS]...", rich_help_panel=PANEL)(submit)
    app.command(rich_help_panel=PANEL)(watch)
