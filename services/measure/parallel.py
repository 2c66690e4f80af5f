"""The multi-GPU oracle: one training step of each simulated rank of a dp x tp x cp layout, on fake tensors.

A rank is simulated in this process: PyTorch's fake process group (``backend="fake"``, a
``FakeStore``; every collective "succeeds" without moving data, outputs keep their shapes) gives
``torch.distributed`` a world of dp * tp * cp ranks of which this process is one, and the model is
built on fake tensors and parallelised with the real PyTorch code a torchtitan-style job runs:

* tensor parallelism: DTensor ``parallelize_module`` with ColwiseParallel (q, k, v, gate, up and
  the LM head) and RowwiseParallel (o, down, the vocab-parallel embedding), torchtitan's plan;
  ``sequence_parallel`` adds SequenceParallel on the norms and PrepareModuleInput around attention
  and MLP; the loss is loss-parallel (cross-entropy on vocab-sharded logits, torchtitan's default);
* context parallelism: torch's ring attention (``_templated_ring_attention`` with the all-gather
  rotation, behind DTensor's CP dispatcher) over the cp mesh; each rank holds seq / cp tokens;
* FSDP2 ``fully_shard`` of every block and the root over dp (x cp, the flattened dp_cp mesh of
  torchtitan), with MixedPrecisionPolicy(bf16 params, fp32 reduce) for ``fsdp-bf16``, and
  torchtitan's reshard policy (the last block stays gathered after its forward);
* LoRA: peft's ``inject_adapter_in_model`` on the frozen base, before FSDP.

Memory is counted as ``frenzy.measure.tracker.LiveBytes`` counts the single-GPU step (live
storages rounded to 512 B), but from inside the fake-tensor mode: a TorchDispatchMode above
DTensor sees only DTensor-level ops, not the local ops DTensor runs (redistributions, collective
buffers), so every outermost fake-tensor op's outputs are counted, from the model's creation on;
iteration 2 is reported. FSDP2's frees and re-allocations of gathered parameters are storage
resizes, not ops, and are counted through ``LiveBytes.counting_resizes``. The CUDA-only parts on the CPU build: the CPU SDPA kernel has no CP
sharding rule, so ring attention calls the CUDA flash-attention op's fake kernel (same saved
tensors as the CPU flash kernel: output and fp32 log-sum-exp, plus two tiny RNG tensors).
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.testing._internal.distributed.fake_pg import FakeStore

from frenzy.measure.config import MeasureConfig, ParallelConfig, check_parallel
from frenzy.measure.models import TransformerModel, build_model, loss_fn
from frenzy.measure.precision import Policy
from frenzy.measure.step import _optimizer, state_split
from frenzy.measure.tracker import LiveBytes
from marp import ModelSpec


def _device_mesh_init_on_real_tensors() -> None:
    """DeviceMesh computes a rank's coordinates with ``nonzero`` on its mesh tensor, which fake
    tensors cannot do (data-dependent shape); FSDP2 builds meshes while it shards, inside the fake
    mode. The mesh is a few ints: build every DeviceMesh on real tensors."""
    if getattr(DeviceMesh.__init__, "_frenzy_real", False):
        return
    original = DeviceMesh.__init__

    @functools.wraps(original)
    def init(self: DeviceMesh, *args: Any, **kwargs: Any) -> None:
        with unset_fake_temporarily():
            original(self, *args, **kwargs)

    init._frenzy_real = True  # type: ignore[attr-defined]
    DeviceMesh.__init__ = init  # type: ignore[method-assign]


@contextmanager
def _shape_propagation_apart(counting: FakeTensorMode) -> Iterator[None]:
    """DTensor learns an op's output shape by running it once more on fake tensors of the *global*
    shape (``ShardingPropagator._propagate_tensor_meta_non_cached``), in whatever fake mode is
    active: ours, which would count those shadow tensors as memory (8 B per global logit under
    loss parallel, say). While ``counting`` runs, that pass gets a fake mode of its own."""
    from torch.distributed.tensor import _sharding_prop

    original = _sharding_prop.detect_fake_mode
    apart = FakeTensorMode(allow_non_fake_inputs=True)

    def detect(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        return apart if found is counting else found

    _sharding_prop.detect_fake_mode = detect
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = original


class _CountingFakeMode(FakeTensorMode):
    """FakeTensorMode that hands the outputs of every outermost fake op to ``counter``.

    DTensor's local ops reach the fake mode directly (their arguments are FakeTensors), so they
    are seen here; ops a fake kernel runs inside itself (decompositions) are not outermost and are
    not counted -- on a GPU they are one kernel with one output."""

    def __init__(self) -> None:
        # Real inputs: the device meshes' rank tensors.
        super().__init__(allow_non_fake_inputs=True)
        self.counter: LiveBytes | None = None
        self._depth = 0

    def dispatch(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self._depth += 1
        try:
            out = super().dispatch(func, types, args, kwargs)
        finally:
            self._depth -= 1
        if self._depth == 0 and self.counter is not None:
            self.counter.observe(out)
        return out


@dataclass(frozen=True)
class RankMeasurement:
    """One simulated rank's peak of live tensor bytes in iteration 2, split as ``Measurement``'s."""

    rank: int
    coords: dict[str, int]
    peak_bytes: int
    breakdown: dict[str, int]
    phase: str
    phase_peaks: dict[str, int]
    local_params: int  # parameter elements this rank holds (its shards)
    trainable_params: int  # of the whole model (the adapters' under LoRA)
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LayoutMeasurement:
    """Every requested rank of one layout; ``symmetric_to`` maps each other rank to the measured
    rank whose memory it has (same cp coordinate: dp and tp ranks hold equal shards and shapes)."""

    model: str
    config: MeasureConfig
    parallel: ParallelConfig
    ranks: list[RankMeasurement]
    symmetric_to: dict[int, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _tp_plan(model: TransformerModel, sp: bool) -> dict[str, Any]:
    """torchtitan's Llama plan (torchtitan/models/llama3/infra/parallelize.py), on our module names."""
    seq = Shard(1) if sp else Replicate()
    plan: dict[str, Any] = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        # Loss parallel: the logits stay sharded by vocabulary (Shard(-1)) into the loss.
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
    }
    if sp:
        plan["final_norm"] = SequenceParallel()
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}"
        for name in ("attn.q", "attn.k", "attn.v", "mlp.up") + (("mlp.gate",) if block.mlp.swiglu else ()):
            plan[f"{p}.{name}"] = ColwiseParallel()
        plan[f"{p}.attn.o"] = RowwiseParallel(output_layouts=seq)
        plan[f"{p}.mlp.down"] = RowwiseParallel(output_layouts=seq)
        if sp:
            plan[f"{p}.norm1"] = SequenceParallel()
            plan[f"{p}.norm2"] = SequenceParallel()
            plan[f"{p}.attn"] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                   desired_input_layouts=(Replicate(), None, None))  # fmt: skip
            plan[f"{p}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def _ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Causal attention of this rank's q, k and v (seq / cp tokens each) over the whole sequence:
    torch's ring attention, which the CP dispatcher runs for the flash-attention op on DTensors
    sharded by sequence (dim 2)."""
    dq, dk, dv = (DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_flash_attention(dq, dk, dv, 0.0, True)[0]
    return out.to_local()


@contextmanager
def _cp_dispatcher(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    cp_attention._enable_cp_dtensor_dispatcher()
    try:
        yield
    finally:
        cp_attention._disable_cp_dtensor_dispatcher()


def _apply_lora(model: nn.Module, par: ParallelConfig) -> nn.Module:
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import cast_adapter_dtype

    # alpha does not change memory; a dropout above 0 gives each adapter a dropout of its own.
    cfg = LoraConfig(r=par.lora_rank, lora_alpha=2 * par.lora_rank, lora_dropout=par.lora_dropout,
                     target_modules=list(par.lora_targets))  # fmt: skip
    # peft moves each new adapter to its base layer's device and dtype with Module.to, which swaps
    # the parameter objects in place, and fake parameters cannot be swapped (they carry weak
    # references, memory-notes pitfall 3). The moves are skipped: the adapters are created on the
    # CPU in fp32 (nn.Linear's default), which is where get_peft_model leaves them anyway (its
    # autocast_adapter_dtype upcasts bf16 / fp16 adapters to fp32; cast_adapter_dtype below).
    to = nn.Module.to
    nn.Module.to = lambda self, *args, **kwargs: self  # type: ignore[method-assign,assignment]
    try:
        model = inject_adapter_in_model(cfg, model)
    finally:
        nn.Module.to = to  # type: ignore[method-assign]
    cast_adapter_dtype(model, adapter_name="default", autocast_adapter_dtype=True)
    if par.lora_adapter_dtype == "compute":
        # autocast_adapter_dtype=False: each adapter stays in its base layer's dtype (bf16 under
        # pure-bf16; fp32 under fp32 and fsdp-bf16, whose FSDP policy casts it for compute). The
        # storage is replaced through .data, as peft's cast_adapter_dtype does: fake parameters
        # cannot be swapped for new objects.
        base = next(p.dtype for n, p in model.named_parameters() if "lora_" not in n)
        for name, p in model.named_parameters():
            if "lora_" in name and p.dtype != base:
                p.data = p.data.to(base)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def _meshes(par: ParallelConfig) -> tuple[DeviceMesh | None, DeviceMesh | None, DeviceMesh | None]:
    """(FSDP mesh over dp x cp, tp mesh, cp mesh); None where the degree is 1."""
    mesh = init_device_mesh("cpu", (par.dp, par.cp, par.tp), mesh_dim_names=("dp", "cp", "tp"))
    shard: DeviceMesh | None = None
    if par.dp > 1 and par.cp > 1:
        shard = mesh["dp", "cp"]._flatten("dp_cp")
    elif par.fsdp:
        shard = mesh["dp"] if par.dp > 1 else mesh["cp"]
    return shard, (mesh["tp"] if par.tp > 1 else None), (mesh["cp"] if par.cp > 1 else None)


def measure_rank(spec: ModelSpec, config: MeasureConfig, par: ParallelConfig, rank: int = 0) -> RankMeasurement:
    """Simulate ``rank`` of the layout: two training iterations, the second measured."""
    check_parallel(spec, config, par)
    if not 0 <= rank < par.world_size:
        raise ValueError(f"rank {rank} is outside the layout's {par.world_size} ranks")
    _device_mesh_init_on_real_tensors()
    started = time.perf_counter()
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=par.world_size)
    try:
        shard_mesh, tp_mesh, cp_mesh = _meshes(par)
        return _run(spec, config, par, rank, shard_mesh, tp_mesh, cp_mesh, started)
    finally:
        dist.destroy_process_group()


def _run(spec: ModelSpec, config: MeasureConfig, par: ParallelConfig, rank: int, shard_mesh: DeviceMesh | None,
         tp_mesh: DeviceMesh | None, cp_mesh: DeviceMesh | None, started: float) -> RankMeasurement:  # fmt: skip
    fsdp_mixed = config.precision == "fsdp-bf16"
    # fsdp-bf16 builds fp32 parameters and lets FSDP cast them; the model itself casts nothing.
    policy = Policy("fp32" if fsdp_mixed else config.precision)
    b, s = config.micro_batch, config.seq_len // par.cp
    fake = _CountingFakeMode()
    tracker = LiveBytes(config.round_bytes)
    fake.counter = tracker  # from the first parameter on: whatever is live at iteration 2 is counted
    # counting_resizes: FSDP2 frees a gathered layer by resizing its storage to 0 (no aten op).
    with _shape_propagation_apart(fake), fake, tracker.counting_resizes():
        model: nn.Module = build_model(spec, policy, config.attention, config.recompute, config.gqa, 0.0)
        if par.finetune == "lora":
            model = _apply_lora(model, par)
        if tp_mesh is not None:
            parallelize_module(model, tp_mesh, _tp_plan(model, par.sequence_parallel))  # type: ignore[arg-type]
        if cp_mesh is not None:
            for block in model.blocks:  # type: ignore[union-attr]
                block.attn.sdpa = functools.partial(_ring_attention, mesh=cp_mesh)
        if shard_mesh is not None:
            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if fsdp_mixed
                  else MixedPrecisionPolicy())  # fmt: skip
            # torchtitan's default policy (parallelize.py, apply_fsdp): every block but the last
            # reshards after its forward -- the last would be gathered again at once for the backward;
            # torchtune's shard_model reshards every one (reshard_after_forward=True).
            blocks = model.blocks  # type: ignore[union-attr]
            keep_last = par.fsdp_reshard == "keep-last"
            for i, block in enumerate(blocks):
                fully_shard(block, mesh=shard_mesh, mp_policy=mp,
                            reshard_after_forward=not keep_last or i < len(blocks) - 1)  # fmt: skip
            fully_shard(model, mesh=shard_mesh, mp_policy=mp)
        # The sharded parameters (FSDP swaps unsharded ones onto the modules during a pass).
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        opt = _optimizer(config.optimizer, trainable, "foreach")
        compute_loss = loss_fn(spec)
        ids = torch.randint(0, spec.vocab, (b, s))
        labels = torch.randint(0, spec.vocab, (b, s))

        def iteration(phase: Callable[[str], None]) -> None:
            opt.zero_grad(set_to_none=True)
            phase("forward+loss")
            logits = model(ids)
            logits.register_hook(lambda grad: phase("backward"))
            with loss_parallel() if tp_mesh is not None else contextlib.nullcontext():
                loss = compute_loss(logits, labels)
                del logits
                loss.backward()
            del loss
            phase("optimizer")
            opt.step()

        def classify(tr: LiveBytes) -> dict[str, int]:
            return state_split(tr, params, trainable, opt)

        with _cp_dispatcher(cp_mesh is not None):
            iteration(lambda name: None)
            opt.zero_grad(set_to_none=True)
            tracker.classify = classify
            tracker.peak = tracker.current
            tracker.peak_breakdown = classify(tracker)
            tracker.phase_peaks = {}
            iteration(tracker.set_phase)
        fake.counter = None
    local = sum(_local(p).numel() for p in params)
    n_trainable = sum(p.numel() for p in trainable)  # a DTensor's numel is the global one
    return RankMeasurement(
        rank=rank, coords=par.rank_coords(rank), peak_bytes=tracker.peak, breakdown=dict(tracker.peak_breakdown),
        phase=tracker.peak_phase, phase_peaks=dict(tracker.phase_peaks), local_params=local,
        trainable_params=n_trainable, seconds=round(time.perf_counter() - started, 3),
    )  # fmt: skip


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def distinct_ranks(par: ParallelConfig) -> list[int]:
    """One rank per cp coordinate (dp 0, tp 0): the ranks whose memory can differ. dp ranks hold
    equal shards (FSDP pads the last one's to the same size) and run the same shapes; tp ranks
    split heads, the MLP and the vocabulary evenly (the oracle requires it); cp ranks do not:
    the load-balanced ring attention computes different halves at each step."""
    return [c * par.tp for c in range(par.cp)]


def measure_layout(spec: ModelSpec, config: MeasureConfig, par: ParallelConfig,
                   ranks: list[int] | None = None,
                   progress: Callable[[int, int, int | None], None] | None = None) -> LayoutMeasurement:  # fmt: skip
    """Measure ``ranks`` (default: ``distinct_ranks``); the others are mapped to their symmetric one.

    ``progress(done, total, rank)`` hears each rank before it is measured (``done`` measured so far
    of ``total``) and ``(total, total, None)`` at the end: `frenzy measure` draws its bar from it."""
    check_parallel(spec, config, par)
    chosen = distinct_ranks(par) if ranks is None else sorted(set(ranks))
    results = []
    for done, rank in enumerate(chosen):
        if progress is not None:
            progress(done, len(chosen), rank)
        # One process per rank: torch.distributed keeps per-process state that a destroyed and
        # re-created fake process group does not reset (DTensor's dispatch caches hold the first
        # rank's meshes, whose groups no longer resolve).
        results.append(measure_rank(spec, config, par, rank) if len(chosen) == 1
                       else _measure_in_subprocess(spec, config, par, rank))  # fmt: skip
    if progress is not None:
        progress(len(chosen), len(chosen), None)
    symmetric: dict[int, int] = {}
    if ranks is None:
        for r in range(par.world_size):
            if r not in chosen:
                symmetric[r] = par.rank_coords(r)["cp"] * par.tp
    notes = []
    if symmetric:
        notes.append("ranks not simulated have the memory of the simulated rank with their cp coordinate "
                     "(dp and tp ranks are symmetric); --all-ranks simulates each")  # fmt: skip
    return LayoutMeasurement(model=spec.name, config=config, parallel=par, ranks=results, symmetric_to=symmetric,
                             notes=notes)  # fmt: skip


def _measure_in_subprocess(spec: ModelSpec, config: MeasureConfig, par: ParallelConfig, rank: int) -> RankMeasurement:
    job = json.dumps({"spec": asdict(spec), "config": asdict(config), "parallel": asdict(par), "rank": rank})
    proc = subprocess.run([sys.executable, "-m", "frenzy.measure.parallel"], input=job, capture_output=True,
                          text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"measuring rank {rank} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return RankMeasurement(**json.loads(proc.stdout.strip().splitlines()[-1]))


def _main() -> None:
    """Measure one rank described by a JSON job on stdin; print its RankMeasurement as JSON."""
    job = json.loads(sys.stdin.read())
    par = job["parallel"]
    par["lora_targets"] = tuple(par["lora_targets"])
    spec = ModelSpec(**job["spec"])
    result = measure_rank(spec, MeasureConfig(**job["config"]), ParallelConfig(**par), job["rank"])
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    _main()


__all__ = ["LayoutMeasurement", "RankMeasurement", "distinct_ranks", "measure_layout", "measure_rank"]
