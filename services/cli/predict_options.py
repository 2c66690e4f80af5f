"""`frenzy predict`'s options: one typer alias per option and the typed object they fill.

``PredictArgs`` is the command's parameter list (``frenzy.cli.typed_options.options_command``), so
``predict`` (frenzy.cli.cmd_predict) and its steps read ``args.seq_len`` rather than a list of
forty positional parameters (issue 31: no function over 150 lines). Only typer here: importing it
loads no MARP (tests/unit/cli/test_cli_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from frenzy.cli.output import JsonOpt

# marp.plans.DEFAULT_MIN_SCALING_EFF, named in --help without importing MARP (numpy) for every
# `frenzy` command; tests/unit/cli/test_cli_registry.py checks the two agree.
DEFAULT_MIN_SCALING_EFF = 0.7

STAGE_HELP = ("Single layout: pipeline stage reported, first | last | max. Or a mixed layout over GPU types, one "
              "GPUS:LAYERS[:tpK] per stage in pipeline order, GPUS NxTYPE or a data-parallel group NxTYPE+MxTYPE "
              "(e.g. --stage 4xA100-80GB:24 --stage 16xL4:16).")
LOCAL_HELP = "Mixed layout: TYPE=N, the micro batch of that GPU type's ranks (repeat; default --micro-batch)."
MIXED_HELP = ("Ranked mode: also rank plans over two GPU types at a time (default: on with a --cluster file of "
              "several types).")
OBJECTIVE_HELP = ("Ranked mode: what the plan minimises among those that fit: time (completion) | cost (dollars: "
                  "GPUs x price per GPU-hour x runtime; frenzy gpus lists the prices, a --cluster file's "
                  "price_per_gpu_hour overrides them) | gpu-hours. docs/cost.md.")
DEADLINE_HELP = ("Ranked mode: the job must finish within this long (from submission), e.g. 12h, 90m, 1h30m, 2d; "
                 "plans that cannot are dropped, with the reason shown.")
BUDGET_HELP = "Ranked mode: the job may cost at most this many dollars (e.g. 250); dearer plans are dropped."

ModelOpt = Annotated[str, typer.Option(help="Catalog name (frenzy models), a config.json path, or inline JSON "
                                       "(HF config or Frenzy's neutral spec).")]
SeqLenOpt = Annotated[int, typer.Option(help="Tokens per sample.")]
GlobalBatchOpt = Annotated[int, typer.Option(help="Samples per optimizer step, across all GPUs "
                                             "(single-layout mode: default dp x micro batch).")]
MicroBatchOpt = Annotated[int, typer.Option(help="Samples per GPU per forward pass (0: planner chooses).")]
PrecisionOpt = Annotated[str, typer.Option(help="fp32 | amp-fp16 | amp-bf16 | master-fp16 | master-bf16 | bf16 | "
                                           "fsdp-bf16. Single-layout mode: bf16 = everything in bf16; ranked "
                                           "mode keeps bf16 / fp16 as the master-* policies (job spec names).")
                         ]
OptimizerOpt = Annotated[str, typer.Option(help="adamw | adam | sgd | sgd-momentum | adam8bit.")]
OptimizerImplOpt = Annotated[str | None, typer.Option(help="foreach | fused | forloop (default: the "
                                                      "policy's usual one).")]
TrainStepsOpt = Annotated[int, typer.Option(help="Optimizer steps (for completion time and GPU-hours).")]
RecomputeOpt = Annotated[str | None, typer.Option(help="none | selective | full | op-sac. Ranked mode: 'none' "
                                                  "forbids recomputation.")]
NoRecomputeOpt = Annotated[bool, typer.Option("--no-recompute", help="Ranked mode: forbid recomputation.")]
AttentionOpt = Annotated[str | None, typer.Option(help="flash | eager (materialised s x s scores).")]
FlashOpt = Annotated[bool, typer.Option(help="Flash attention (same as --attention flash).")]
DropoutOpt = Annotated[float | None, typer.Option(help="Dropout probability (default: the model config's).")
                       ]
LossOpt = Annotated[str | None, typer.Option(help="torch | fused | chunked | megatron-fused | inplace | fused-copy (Megatron 2023, max subtracted out of place).")]
FinetuneOpt = Annotated[str, typer.Option(help="full | lora | qlora (frozen base, trained adapters; qlora: "
                                          "NF4 base).")]
LoraRankOpt = Annotated[int, typer.Option(help="Rank of the LoRA / QLoRA adapters.")]
LoraDropoutOpt = Annotated[float, typer.Option(help="peft's lora_dropout on the adapters' inputs, in [0, 1) "
                                               "(above 0 each adapted linear keeps a dropped-out copy).")]
LoraAdapterDtypeOpt = Annotated[str, typer.Option(help="fp32 | compute: the adapters' dtype; peft upcasts them "
                                                  "to fp32 (default), torchtune keeps the base's. Matters under "
                                                  "pure bf16: fp32 states and fp32 input copies.")]
FsdpReshardOpt = Annotated[str, typer.Option(help="keep-last | all: FSDP2 blocks resharded after their forward; "
                                             "torchtitan keeps the last gathered (default), torchtune reshards "
                                             "all (one block less at the loss).")]
QloraBackendOpt = Annotated[str, typer.Option(help="bitsandbytes | torchao: QLoRA's NF4 base; peft's bitsandbytes "
                                              "(default) keeps the block constants whole on every FSDP / ZeRO-3 "
                                              "rank, torchtune's torchao shards them.")]
MainGradDtypeOpt = Annotated[str, typer.Option(help="fp32 | half: Megatron's main-grad buffer under master-fp16 / "
                                               "master-bf16 (fp16 / bf16 in ranked mode); half is --fp16's "
                                               "default, fp32 --accumulate-allreduce-grads-in-fp32 (forced "
                                               "under --bf16).")]
WeightDecayOpt = Annotated[float | None, typer.Option(help="Optimizer weight decay (default: the optimizer's "
                                                      "own, AdamW 0.01, others 0).")]
EpOpt = Annotated[int, typer.Option(help="Expert-parallel degree (mixture-of-experts models; divides dp).")]
PpLayersOpt = Annotated[str | None, typer.Option(help="Layers of each pipeline stage, e.g. 2,4,4,2 (with --vpp: "
                                                 "of each virtual stage; default: an even split).")]
EtpOpt = Annotated[int | None, typer.Option(help="Expert-tensor-parallel degree (mixture-of-experts models; "
                                            "default: tp).")]
LoraTargetsOpt = Annotated[str | None, typer.Option(help="Linears with LoRA / QLoRA adapters, e.g. "
                                                    "q,k,v,o,gate,up,down (default: q,k,v,o).")]
CompiledOpt = Annotated[bool, typer.Option("--compile", help="The model runs under torch.compile (pointwise "
                                           "ops fused and recomputed: fewer saved activations).")]
Float8Opt = Annotated[bool, typer.Option("--float8", help="Float8 linears (torchao / Transformer Engine); only "
                                         "GPUs with fp8 tensor cores.")]
DpOpt = Annotated[int | None, typer.Option(help="Single layout: data-parallel degree.")]
TpOpt = Annotated[int | None, typer.Option(help="Single layout: tensor-parallel degree.")]
PpOpt = Annotated[int | None, typer.Option(help="Single layout: pipeline-parallel degree.")]
VppOpt = Annotated[int | None, typer.Option(help="Single layout: interleaved 1F1B chunks per pipeline rank.")
                   ]
CpOpt = Annotated[int | None, typer.Option(help="Single layout: context-parallel degree.")]
ZeroOpt = Annotated[int | None, typer.Option(help="Single layout: ZeRO stage 0-3.")]
SequenceParallelOpt = Annotated[bool, typer.Option("--sequence-parallel",
                                                   help="Single layout: Megatron sequence parallelism.")]
StageOpt = Annotated[list[str] | None, typer.Option(help=STAGE_HELP)]
LocalMicroBatchOpt = Annotated[list[str] | None, typer.Option("--local-micro-batch", help=LOCAL_HELP)]
MixedOpt = Annotated[bool | None, typer.Option("--mixed/--no-mixed", help=MIXED_HELP)]
GpuOpt = Annotated[str | None, typer.Option(help="Single layout: the GPU type (frenzy gpus).")]
ClusterOpt = Annotated[Path | None, typer.Option(help="Plan for this cluster file's GPU types.")]
GpuTypesOpt = Annotated[list[str] | None, typer.Option("--gpu-type", help="Only these GPU types (repeat).")]
MaxGpusOpt = Annotated[int, typer.Option(help="At most this many GPUs (0: no limit).")]
RankByOpt = Annotated[str, typer.Option(help="Ranked mode: time (completion time) | gpu_hours.")]
InterNodeGbpsOpt = Annotated[float | None, typer.Option(
    "--inter-node-gbps", help="GB/s per GPU between nodes, for the step time (default: the cluster file's, "
    "else the GPU generation's: 50 for H100/H200/B200, 25 for A100).")]
MinScalingEffOpt = Annotated[float | None, typer.Option(
    "--min-scaling-eff", help="Ranked mode: plans whose GPU-hours exceed the cheapest plan of their GPU type's "
    f"by more than 1 / this rank last (default {DEFAULT_MIN_SCALING_EFF}; 0: off).")]
TopOpt = Annotated[int, typer.Option(help="Rows to show in the table.")]

ObjectiveOpt = Annotated[str, typer.Option(help=OBJECTIVE_HELP)]
DeadlineOpt = Annotated[str | None, typer.Option(help=DEADLINE_HELP)]
BudgetOpt = Annotated[str | None, typer.Option(help=BUDGET_HELP)]


@dataclass
class PredictArgs:  # (not frozen: the checks settle --attention/--flash and the recipe tuning in place)
    """Every `frenzy predict` option, as typed values (None: not given). The fields are the command's
    parameters, in this order (``frenzy.cli.typed_options.options_command``): each option is
    declared once, here, with its help, its flag and its default."""

    model: ModelOpt
    seq_len: SeqLenOpt
    global_batch: GlobalBatchOpt = 0
    micro_batch: MicroBatchOpt = 0
    precision: PrecisionOpt = "bf16"
    optimizer: OptimizerOpt = "adamw"
    optimizer_impl: OptimizerImplOpt = None
    train_steps: TrainStepsOpt = 1000
    recompute: RecomputeOpt = None
    no_recompute: NoRecomputeOpt = False
    attention: AttentionOpt = None
    flash: FlashOpt = True
    dropout: DropoutOpt = None
    loss: LossOpt = None
    finetune: FinetuneOpt = "full"
    lora_rank: LoraRankOpt = 16
    lora_dropout: LoraDropoutOpt = 0.0
    lora_adapter_dtype: LoraAdapterDtypeOpt = "fp32"
    fsdp_reshard: FsdpReshardOpt = "keep-last"
    qlora_backend: QloraBackendOpt = "bitsandbytes"
    main_grad_dtype: MainGradDtypeOpt = "fp32"
    weight_decay: WeightDecayOpt = None
    ep: EpOpt = 1
    pp_layers: PpLayersOpt = None
    etp: EtpOpt = None
    lora_targets: LoraTargetsOpt = None
    compiled: CompiledOpt = False
    float8: Float8Opt = False
    dp: DpOpt = None
    tp: TpOpt = None
    pp: PpOpt = None
    vpp: VppOpt = None
    cp: CpOpt = None
    zero: ZeroOpt = None
    sequence_parallel: SequenceParallelOpt = False
    stage: StageOpt = None
    local_micro_batch: LocalMicroBatchOpt = None
    mixed: MixedOpt = None
    gpu: GpuOpt = None
    cluster: ClusterOpt = None
    gpu_types: GpuTypesOpt = None
    max_gpus: MaxGpusOpt = 0
    rank_by: RankByOpt = "time"
    objective: ObjectiveOpt = "time"
    deadline: DeadlineOpt = None
    budget: BudgetOpt = None
    inter_node_gbps: InterNodeGbpsOpt = None
    min_scaling_eff: MinScalingEffOpt = None
    top: TopOpt = 20
    as_json: JsonOpt = False
