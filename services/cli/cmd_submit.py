"""``frenzy submit`` and ``frenzy watch``: send a job (its code packed and uploaded first) and
follow it to its end.

The job entry is built and checked by the one pydantic model every front door uses
(``frenzy.rpc.jobspec``), so a bad flag is reported here exactly as REST and the batch file
report it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, SchedulerOpt, echo_json, fail, scheduler_call
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.v1 import scheduler_pb2, types_pb2

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


def watch(job_id: str, scheduler: SchedulerOpt = "") -> None:
    """Follow a job's state changes until it ends."""
    with scheduler_call(scheduler) as stub:
        j = _follow(stub, job_id)
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
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                rich_help_panel=PANEL)(submit)
    app.command(rich_help_panel=PANEL)(watch)
