"""`frenzy`: the command line for users, operators and the local stack.

Users: `predict` (which plans would my job get?), `submit`, `jobs`, `job`,
`watch`, `cancel`, `nodes`, `models`, `gpus`, `batch`. Operators: `agent`,
`scheduler`, `predictor`, `worker`, `api`. Local: `up` (the whole stack on
this machine) and `demo` (up, one job end to end, down).

Exit codes: 0 ok; 1 failure; 2 bad input (INVALID_ARGUMENT); 3 the cluster
cannot do it (FAILED_PRECONDITION); 4 not found.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import grpc
import typer

import marp
from frenzy.auth.credentials import credentials_path
from frenzy.cli import render
from frenzy.cli.output import (  # noqa: F401
    EXIT_ALREADY_ENDED,
    EXIT_BY_CODE,
    JsonOpt,
    SchedulerOpt,
    TlsCaOpt,
    TlsCertOpt,
    TlsKeyOpt,
    echo_json,
    fail,
    rpc_fail,
    scheduler_call,
)
from frenzy.cli.service_opts import LogFormatOpt, MetricsAddressOpt
from frenzy.rpc.client import DEFAULT_PREDICTOR, DEFAULT_SCHEDULER, scheduler_stub
from frenzy.rpc.job_json import job_list
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.signals import stop_on_signals
from frenzy.v1 import scheduler_pb2, types_pb2


def _redis_url_from_file() -> None:
    """REDIS_URL from the first line of the file REDIS_URL_FILE names, when REDIS_URL is unset.

    Containers get the Redis password as a file in a volume (compose.yaml), never in their
    environment's definition; done here, before any option is parsed, so every command's
    ``--redis-url`` (envvar REDIS_URL) and the worker's Celery app see it alike."""
    path = os.environ.get("REDIS_URL_FILE")
    if not path or os.environ.get("REDIS_URL"):
        return
    try:
        with open(path, encoding="utf-8") as fh:
            url = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        sys.exit(f"error: REDIS_URL_FILE={path}: cannot read it ({getattr(exc, 'strerror', None) or exc}). "
                 "To fix: point REDIS_URL_FILE at a readable file holding redis://USER:PASSWORD@HOST:PORT/DB")
    if not url:
        sys.exit(f"error: REDIS_URL_FILE={path}: the file's first line is empty; it should hold a redis:// URL")
    os.environ["REDIS_URL"] = url


_redis_url_from_file()

app = typer.Typer(
    name="frenzy",
    help="Frenzy: train LLMs on a heterogeneous GPU cluster without choosing GPUs.\n\n"
    "Describe the model and the recipe; Frenzy predicts the memory each GPU needs under every parallel "
    "layout, ranks the plans, reserves the best plan the cluster can hold and launches it.\n\n"
    "Start here:  frenzy demo        (whole stack on this machine, one job end to end)\n\n"
    "             frenzy predict --model llama-2-7b --seq-len 4096 --global-batch 64",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

def _logging(level: str, fmt: str = "text") -> None:
    from frenzy.cli.service_opts import setup_logging

    setup_logging(level, fmt)


# ---- catalogs ----------------------------------------------------------------------------------


@app.command()
def models(as_json: JsonOpt = False) -> None:
    """List the model catalog (names usable with --model)."""
    rows = []
    for m in marp.list_models():
        rows.append({"name": m.name, "family": m.family, "parameters": m.param_count(), "layers": m.n_layers,
                     "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "ffn": m.ffn, "mlp": m.mlp,
                     "vocab": m.vocab, "tied_embeddings": m.tied_embeddings})
    if as_json:
        echo_json(rows)
        return
    from rich.table import Table

    t = Table(title="Model catalog", title_justify="left")
    for col in ("NAME", "FAMILY", "PARAMS", "LAYERS", "HIDDEN", "HEADS", "KV", "FFN", "MLP", "VOCAB"):
        t.add_column(col, justify="left" if col in ("NAME", "FAMILY", "MLP") else "right")
    for r in rows:
        t.add_row(r["name"], r["family"], f"{r['parameters'] / 1e9:.2f} B", str(r["layers"]), str(r["hidden"]),
                  str(r["heads"]), str(r["kv_heads"]), str(r["ffn"]), r["mlp"], str(r["vocab"]))
    render.console().print(t)


@app.command()
def gpus(as_json: JsonOpt = False) -> None:
    """List the GPU catalog (types usable in cluster files and --gpu-types)."""
    rows = [{"name": g.name, "memory_gib": round(g.memory_bytes / render.GiB, 1), "bf16_tflops": g.bf16_tflops,
             "fp16_tflops": g.fp16_tflops, "mem_bw_gbps": g.mem_bw_gbps, "intra_node_link": g.intra_node_link,
             "intra_node_gbps": g.intra_node_gbps} for g in marp.list_gpus()]
    if as_json:
        echo_json(rows)
        return
    from rich.table import Table

    t = Table(title="GPU catalog", title_justify="left")
    for col in ("NAME", "MEMORY GiB", "BF16 TFLOPS", "FP16 TFLOPS", "MEM BW GB/s", "LINK", "LINK GB/s"):
        t.add_column(col, justify="left" if col in ("NAME", "LINK") else "right")
    for r in rows:
        t.add_row(r["name"], str(r["memory_gib"]), str(r["bf16_tflops"]), str(r["fp16_tflops"]),
                  str(r["mem_bw_gbps"]), r["intra_node_link"], str(r["intra_node_gbps"]))
    render.console().print(t)


# ---- jobs ----------------------------------------------------------------------------------------


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
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
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends.")] = False,
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
    """Submit a job: the model and recipe, then the command after `--`.

    The recipe flags (--finetune, --lora-*, --ep, --etp, --pp-layers, --compile, --float8,
    --weight-decay, --fsdp-reshard, --qlora-backend) are those of `frenzy predict`: the job is
    planned the way it will run.

    The current directory travels with the job (what git would commit, at most --max-code-mib):
    each node runs the command in a fresh copy of it. --workdir (a directory on the nodes) or
    --no-code runs it without packing.

        frenzy submit --model gpt2-124m --seq-len 1024 --global-batch 32 -- python train.py --tp {tp}
    """
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
                            **_recipe_flags(
                                finetune=finetune, lora_rank=lora_rank, lora_targets=lora_targets,
                                weight_decay=weight_decay, ep=ep, etp=etp, pp_layers=pp_layers, compile=compiled,
                                float8=float8, lora_dropout=lora_dropout, lora_adapter_dtype=lora_adapter_dtype,
                                fsdp_reshard=fsdp_reshard, qlora_backend=qlora_backend,
                                main_grad_dtype=main_grad_dtype)}).to_proto()
    except JobSpecError as exc:
        msg = str(exc)
        if msg.startswith("command"):
            msg += ". To fix: put the command after `--`, e.g. `frenzy submit ... -- python train.py`"
        fail(msg, 2)
    packed = None if (workdir or no_code) else _pack_code(code_dir, max_code_mib)
    with scheduler_call(scheduler) as stub:
        if packed is not None:
            spec.code_sha256 = _upload_code(stub, packed, quiet=as_json)
        resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=60)
        job = resp.job
        if as_json and not wait:
            echo_json(render.to_dict(resp))
            return
        render.console().print(f"submitted [bold]{job.id}[/]{' (duplicate)' if resp.duplicate else ''}: "
                               f"{job.model_name}, {len(job.candidate_plans)} candidate plans; best "
                               f"{job.candidate_plans[0].num_gpus} x {job.candidate_plans[0].gpu_type}")
        if wait:
            job = _follow(stub, job.id)
            if as_json:
                echo_json(render.to_dict(job))
            if render.state_name(job.state) != "SUCCEEDED":
                if not as_json:
                    show_failure(job)
                raise typer.Exit(1)


def show_failure(j: types_pb2.Job) -> None:
    """Why a job failed, where `--wait` ends: the reason, the cause the agent recognised and the
    last lines of the failing node's output (from its exit report: no second call)."""
    con = render.console()
    for line in render.failure_lines(j):
        con.print(line, highlight=False)
    if render.state_name(j.state) == "FAILED" and not (j.attempts and j.attempts[-1].tail):
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


def _follow(stub, job_id: str, quiet: bool = False) -> types_pb2.Job:  # noqa: ANN001
    con = render.console()
    last = None
    for update in stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id)):
        last = update.job
        if not quiet:
            t = update.transition
            con.print(f"{render.when(t.at)}  {render.styled_state(t.state):<12} {render.user_text(t.reason)}")
    if last is None:
        last = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id))
    return last


@app.command()
def jobs(
    state: Annotated[list[str] | None, typer.Option(help="Only jobs in this state (repeat).")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first, with the pending reason of waiting jobs."""
    states = []
    for s in state or []:
        try:
            states.append(types_pb2.JobState.Value(f"JOB_STATE_{s.upper()}"))
        except ValueError:
            fail(f"state: unknown state {s!r}; one of PENDING RESERVED LAUNCHING RUNNING SUCCEEDED FAILED CANCELLED", 2)
    with scheduler_call(scheduler) as stub:
        resp = stub.ListJobs(scheduler_pb2.ListJobsRequest(states=states, limit=limit), timeout=30)
    if as_json:  # the same rows as GET /api/jobs (frenzy.rpc.job_json)
        echo_json(job_list(resp.jobs))
    else:
        render.console().print(render.jobs_table(resp.jobs))


@app.command()
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


@app.command()
def watch(job_id: str, scheduler: SchedulerOpt = "") -> None:
    """Follow a job's state changes until it ends."""
    with scheduler_call(scheduler) as stub:
        j = _follow(stub, job_id)
    raise typer.Exit(0 if render.state_name(j.state) == "SUCCEEDED" else 1)


@app.command()
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


@app.command()
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


# ---- servers --------------------------------------------------------------------------------------


def _stop_event() -> threading.Event:
    """Set on SIGINT/SIGTERM. Installed before a server starts, so a signal during start-up
    stops it cleanly once it is up instead of killing it half-started."""
    stop = threading.Event()
    stop_on_signals(stop)
    return stop


@app.command("predictor")
def predictor_cmd(
    address: Annotated[str, typer.Option(help="host:port to listen on.")] = DEFAULT_PREDICTOR,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_ca: TlsCaOpt = None,
    metrics_address: MetricsAddressOpt = "",
    log_level: Annotated[str, typer.Option()] = "INFO",
    log_format: LogFormatOpt = "text",
) -> None:
    """Run the Predictor gRPC server (MARP; stateless). Keep it on a private address, or give it
    --tls-ca so only the scheduler (with a client certificate) reaches it."""
    from frenzy.cli.service_opts import check_metrics_address, start_metrics
    from frenzy.predictor.server import PredictorMetrics, serve
    from frenzy.rpc.server import stop_server
    from frenzy.rpc.tls import ServerTls, TlsConfigError

    _logging(log_level, log_format)
    check_metrics_address(metrics_address)
    try:
        tls = ServerTls.from_files(tls_cert, tls_key, tls_ca)
    except TlsConfigError as exc:
        fail(str(exc), 2)
    stop = _stop_event()
    metrics = PredictorMetrics()
    server, port, health = serve(address, tls=tls, metrics=metrics)
    try:
        endpoint = start_metrics(metrics.registry, metrics_address, "predictor")
    except BaseException:
        stop_server(server, health)
        raise
    log = logging.getLogger("frenzy.predictor")
    log.info("predictor listening on %s (port %d)", address, port)
    if endpoint is not None:
        log.info("metrics on %s", endpoint.url)
    stop.wait()
    stop_server(server, health)
    if endpoint is not None:
        endpoint.stop()


@app.command("scheduler")
def scheduler_cmd(
    address: Annotated[str, typer.Option(help="host:port to listen on.")] = DEFAULT_SCHEDULER,
    predictor: Annotated[str, typer.Option(envvar="FRENZY_PREDICTOR", help="Predictor address.")] = DEFAULT_PREDICTOR,
    redis_url: Annotated[str, typer.Option(envvar="REDIS_URL")] = "redis://127.0.0.1:6379/0",
    prefix: Annotated[str, typer.Option(envvar="FRENZY_PREFIX", help="Redis key prefix.")] = "frenzy",
    tick_s: Annotated[float, typer.Option(help="Seconds between scheduling passes.")] = 0.25,
    node_dead_after_s: Annotated[float, typer.Option(
        envvar="FRENZY_NODE_DEAD_AFTER_S",
        help="A node without heartbeat lease for this long is declared dead; its jobs are requeued.")] = 30.0,
    max_attempts: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_ATTEMPTS", min=1, help="Attempts per job before a node loss fails it.")] = 3,
    orphan_release_s: Annotated[float, typer.Option(
        envvar="FRENZY_ORPHAN_RELEASE_S",
        help="Free GPUs/ports of an ended reservation whose node never reported the exit after this long.")] = 120.0,
    master_ports: Annotated[str, typer.Option(
        envvar="FRENZY_MASTER_PORTS", help="torchrun rendezvous ports handed out per node, FIRST-LAST.")]
    = "29500-32767",
    policy: Annotated[str, typer.Option(
        envvar="FRENZY_POLICY",
        help="Queue policy, by the name the simulator gives it (`frenzy simulate --policies`): 'frenzy' "
             "(shortest-first with aging over MARP's ranked plans -- a job goes first once it has waited 4 h "
             "and 10x its own runtime --, waiting for a better-ranked plan when "
             "that finishes over 20 % sooner, and stopping a long job that says it resumes from a checkpoint "
             "(submit --resumable), or two of one GPU type, once for a burst of much shorter ones; the "
             "default, chosen on the simulator's tuning split, docs/simulator.md), 'frenzy-wait4h' (a job "
             "goes first after 4 h whatever its length), 'frenzy-single' (one "
             "job at a time), 'frenzy-restop' (that, a job stopped again after an hour's run), "
             "'frenzy-nostop' (no stop), "
             "'frenzy-ranked' (without the wait or the stop), 'frenzy-completion' "
             "(completion-time-aware plan choice, and stopping a job submitted under a minute ago for a "
             "much shorter one), 'frenzy-nopreempt' (frenzy-completion never stopping a running job), "
             "'frenzy-fifo' (frenzy in submit order) or 'frenzy-paper' (FIFO with backfill, first "
             "satisfiable plan; the Frenzy paper's HAS; 'paper' works too).")] = "frenzy",
    max_queued_per_user: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_QUEUED_PER_USER", min=1,
        help="PENDING jobs one user may have; more submissions are refused (RESOURCE_EXHAUSTED).")] = 1000,
    max_gpus_per_user: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_GPUS_PER_USER", min=0,
        help="GPUs one user's jobs may hold: a submission is refused while the user holds this many, or when "
             "its smallest plan needs more. 0: no limit.")] = 0,
    max_user_priority: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_USER_PRIORITY", min=-100, max=100,
        help="Highest --priority a non-admin token may give a job (lower is always allowed); admins may give "
             "any of -100..100. Above it: PERMISSION_DENIED.")] = 0,
    submit_rate: Annotated[float, typer.Option(
        envvar="FRENZY_SUBMIT_RATE", min=0.001, help="Submissions a second per user, sustained (token bucket).")]
    = 20.0,
    submit_burst: Annotated[int, typer.Option(
        envvar="FRENZY_SUBMIT_BURST", min=1, help="Submissions one user may make at once before the rate applies.")]
    = 200,
    max_streams: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_STREAMS", min=1,
        help="Open streams (watch, logs -f) in all; must stay below --grpc-workers so unary calls and health "
             "checks always get a thread.")] = 16,
    max_streams_per_user: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_STREAMS_PER_USER", min=1, help="Open streams one user may have.")] = 4,
    grpc_workers: Annotated[int, typer.Option(
        envvar="FRENZY_GRPC_WORKERS", min=2, help="Threads serving gRPC calls.")] = 32,
    leader_ttl_s: Annotated[float, typer.Option(
        envvar="FRENZY_LEADER_TTL_S", min=0.5,
        help="Run several schedulers on one Redis: each serves the API, one leads (places jobs, reaps nodes). "
             "A dead leader's lease lasts this long; then a standby takes over.")] = 3.0,
    serve: Annotated[str, typer.Option(
        envvar="FRENZY_SCHEDULER_SERVE", metavar="all|api|loop",
        help="What this process does: all (the API, and the loop when it leads), api (the API only, never "
             "leads), loop (placement only; its port answers health checks). Run one 'loop' and one or more "
             "'api' on the same Redis so submissions and placement passes never wait for each other.")] = "all",
    metrics_address: MetricsAddressOpt = "",
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_ca: TlsCaOpt = None,
    log_level: Annotated[str, typer.Option()] = "INFO",
    log_format: LogFormatOpt = "text",
) -> None:
    """Run the Scheduler: gRPC API, placement loop (HAS), agent-event consumer and node reaper.

    Its calls to the predictor use TLS when FRENZY_TLS_CA names the CA to trust (with
    FRENZY_TLS_CERT/FRENZY_TLS_KEY as its client certificate for a predictor that asks)."""
    from frenzy.cli.service_opts import check_metrics_address
    from frenzy.rpc.limits import RateLimit, StreamCaps
    from frenzy.rpc.tls import ClientTls, ServerTls
    from frenzy.scheduler.service import SchedulerServer, UserQuotas, parse_port_range

    _logging(log_level, log_format)
    check_metrics_address(metrics_address)
    try:
        ports = parse_port_range(master_ports)
        tls, predictor_tls = ServerTls.from_files(tls_cert, tls_key, tls_ca), ClientTls.from_env()
    except ValueError as exc:
        fail(str(exc), 2)
    from has import QueuePolicy

    try:  # 'paper': the name before the simulator and the scheduler shared one registry
        queue_policy = QueuePolicy.named("frenzy-paper" if policy == "paper" else policy)
    except ValueError as exc:
        fail(f"--policy: {exc}", 2)
    if serve not in ("all", "api", "loop"):
        fail(f"--serve: unknown mode {serve!r}; one of all, api, loop", 2)
    if max_streams >= grpc_workers:
        fail(f"--max-streams ({max_streams}) must be below --grpc-workers ({grpc_workers}), or open streams can "
             "take every thread", 2)
    quotas = UserQuotas(max_queued=max_queued_per_user, max_gpus=max_gpus_per_user,
                        rate=RateLimit(per_s=submit_rate, burst=submit_burst), max_priority=max_user_priority)
    stop = _stop_event()
    server = SchedulerServer(redis_url, predictor, address, prefix=prefix, tick_s=tick_s,
                             dead_after_s=node_dead_after_s, max_attempts=max_attempts,
                             orphan_release_s=orphan_release_s, master_ports=ports, policy=queue_policy,
                             quotas=quotas, stream_caps=StreamCaps(max_streams, max_streams_per_user),
                             max_workers=grpc_workers, tls=tls, predictor_tls=predictor_tls,
                             metrics_address=metrics_address or None, leader_ttl_s=leader_ttl_s, serve=serve)
    logging.getLogger("frenzy.scheduler").info("scheduler (%s) listening on %s (port %d)", serve, address,
                                               server.port)
    if server.metrics is not None:
        logging.getLogger("frenzy.scheduler").info("metrics on %s", server.metrics.url)
    stop.wait()
    server.stop()


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


def _register_optional() -> None:
    """Commands that live next to their service (agent, worker, batch, api)."""
    try:
        from frenzy.agent.cli import agent_command

        app.command("agent")(agent_command)
    except ImportError as exc:  # pragma: no cover - only while a module is missing
        logging.getLogger(__name__).debug("agent command unavailable: %s", exc)
    try:
        from frenzy.worker.cli import batch_app, worker_command

        app.command("worker")(worker_command)
        app.add_typer(batch_app, name="batch")
    except ImportError as exc:  # pragma: no cover
        logging.getLogger(__name__).debug("worker commands unavailable: %s", exc)
    try:
        from frenzy.api.cli import api_command

        app.command("api")(api_command)
    except ImportError as exc:  # pragma: no cover
        logging.getLogger(__name__).debug("api command unavailable: %s", exc)


_register_optional()


def _register_command_modules() -> None:
    """Every ``frenzy/cli/cmd_*.py`` module registers its own commands: ``register(app)``.

    New commands live in their own module next to what they drive, so adding
    one never means editing this file."""
    import importlib
    import pkgutil

    import frenzy.cli as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"frenzy.cli.{info.name}").register(app)


_register_command_modules()


# ---- local stack ---------------------------------------------------------------------------------


@app.command()
def up(
    cluster: Annotated[Path | None, typer.Option(help="Cluster file (default: examples/cluster.yaml if present).")] = None,
    api: Annotated[bool, typer.Option(help="Also serve the HTTP gateway and dashboard.")] = True,
    worker: Annotated[bool, typer.Option(help="Also run the Celery batch worker.")] = True,
    run_dir: Annotated[Path | None, typer.Option(help="Where logs go (default: ./var/run-<time>).")] = None,
) -> None:
    """Start the whole stack locally (Redis, predictor, scheduler, worker, API, fake-GPU agents) until Ctrl-C."""
    stack = _make_stack(cluster, run_dir, with_worker=worker, with_api=api)
    con = render.console()
    # Handlers first: a Ctrl-C at any moment must stop every child cleanly.
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        stack.start(progress=lambda m: con.print(f"  [green]up[/] {m}"))
    except Exception as exc:  # noqa: BLE001 - report any start failure plainly
        fail(f"stack did not start: {exc}")
    where = credentials_path()
    try:
        stack.write_credentials(where)
        found = f"the CLI finds the scheduler and an admin token in {where} (mode 0600)"
    except OSError as exc:
        found = (f"could not write {where} ({exc.strerror}); use "
                 f"FRENZY_CREDENTIALS={stack.credentials_file}")
    con.print(f"\n{found}: `frenzy jobs`, `frenzy submit ...` work as they are.\n"
              f"operator commands (`frenzy token create ...`) need the stack's Redis, password included:\n"
              f"  export REDIS_URL={stack.redis_url}\n"
              f"logs in {stack.run_dir}. Ctrl-C stops everything.")
    try:
        while not stop.wait(1.0):
            stack.check_alive()
    except RuntimeError as exc:
        con.print(f"[red]{exc}[/]")
    finally:
        con.print("stopping ...")
        stack.stop()


def _make_stack(cluster: Path | None, run_dir: Path | None, **kwargs: object):  # noqa: ANN202
    from frenzy.devstack.stack import LocalStack, load_cluster_file
    from has.cluster_spec import ClusterSpecError

    if cluster is None and Path("examples/cluster.yaml").exists():
        cluster = Path("examples/cluster.yaml")
    try:
        spec = load_cluster_file(str(cluster) if cluster else None)
    except ClusterSpecError as exc:
        fail(str(exc), 2)
    run = run_dir or Path("var") / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    return LocalStack.create(spec, run_dir=str(run), redis_url=os.environ.get("REDIS_URL") or None, **kwargs)


DEMO_SCRIPT = (
    "import os, sys, time\n"
    "print('argv', sys.argv[1:])\n"
    "print('frenzy demo job on', os.environ.get('FRENZY_GPU_TYPE'), 'GPUs', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
    "print('layout tp=%s pp=%s dp=%s zero=%s micro_batch=%s grad_accum=%s' % tuple(os.environ.get('FRENZY_' + k) "
    "for k in ('TP', 'PP', 'DP', 'ZERO_STAGE', 'MICRO_BATCH', 'GRAD_ACCUM')))\n"
    "print('rendezvous %s:%s node %s of %s' % (os.environ.get('MASTER_ADDR'), os.environ.get('MASTER_PORT'), "
    "os.environ.get('FRENZY_NODE_RANK'), os.environ.get('FRENZY_NNODES')))\n"
    "loss = 10.0\n"
    "for step in range(5):\n"
    "    loss *= 0.8\n"
    "    print(f'step {step} loss {loss:.3f}', flush=True)\n"
    "    time.sleep(0.1)\n"
)


@app.command()
def demo(
    cluster: Annotated[Path | None, typer.Option(help="Cluster file (default: examples/cluster.yaml).")] = None,
    model: Annotated[str, typer.Option(help="Model of the sample job.")] = "gpt2-355m",
    timeout_s: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 120.0,
    run_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Bring the stack up on a private Redis with fake-GPU agents, run one job end to end, tear down.

    Exits 0 only if the job went PENDING -> ... -> SUCCEEDED and its GPUs were released afterwards.
    """
    stack = _make_stack(cluster, run_dir, with_worker=False, with_api=False)
    stack.redis_url = ""  # the demo always runs on its own private Redis
    con = render.console()
    con.rule("[bold]Frenzy demo")
    ok = False
    try:
        stack.start(progress=lambda m: con.print(f"  [green]up[/] {m}"))
        ok = _demo_job(stack, model, timeout_s)
    except (RuntimeError, grpc.RpcError) as exc:
        con.print(f"[red]demo failed:[/] {exc}")
    finally:
        stack.stop()
        con.print(f"stack stopped; logs in {stack.run_dir}")
    if not ok:
        raise typer.Exit(1)
    con.print("[bold green]demo passed[/]")


def _demo_job(stack, model: str, timeout_s: float) -> bool:  # noqa: ANN001
    con = render.console()
    script = stack.run_dir / "demo_train.py"
    script.write_text(DEMO_SCRIPT)
    spec = parse_entry({"name": "demo", "model": model, "seq_len": 1024, "global_batch": 32, "micro_batch": 4,
                        "train_steps": 100, "command": [sys.executable, str(script), "--tp", "{tp}",
                                                        "--micro-batch", "{micro_batch}"]}).to_proto()
    with scheduler_stub(stack.scheduler_addr, token=stack.token) as stub:
        con.print(render.nodes_table(stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=10).nodes))
        resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=60)
        con.print(f"\nsubmitted [bold]{resp.job.id}[/] ({resp.job.model_name}, seq 1024, global batch 32) "
                  "over gRPC; following it:")
        deadline = time.monotonic() + timeout_s
        final = None
        for update in stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=resp.job.id), timeout=timeout_s):
            t = update.transition
            con.print(f"  {render.when(t.at)}  {render.styled_state(t.state):<12} {render.user_text(t.reason)}")
            final = update.job
            if time.monotonic() > deadline:
                break
        job = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=resp.job.id), timeout=10)
        con.print()
        show_job(job)
        for path in job.log_paths.values():
            if os.path.exists(path):
                con.rule(f"log {path}")
                con.print(Path(path).read_text(errors="replace").rstrip(), markup=False)
        del final
        nodes = stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=10).nodes
        held = [f"{n.name}:{g.index}" for n in nodes for g in n.gpus if g.owner]
        con.print(render.nodes_table(nodes))
        if render.state_name(job.state) != "SUCCEEDED":
            con.print(f"[red]job ended {render.state_name(job.state)}[/]")
            return False
        if held:
            con.print(f"[red]GPUs still held after the job: {held}[/]")
            return False
        con.print("all GPUs released")
        return True


def main() -> None:
    app()


if __name__ == "__main__":
    main()
