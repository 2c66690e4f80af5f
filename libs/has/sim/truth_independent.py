"""The simulator's independent truth (issue 32): how fast a job truly runs, not from MARP.

Role: give the engine (``has.sim.engine``, ``truth="independent"``) a job's true seconds per
step on (GPU type, GPU count, layout) and its true peak memory, so that Frenzy, which plans with
MARP, is not graded by MARP's own speed model. Nothing of MARP's speed code is imported
(``marp.perf``, ``estimate_step_time``, ``Plan.step_time_s``); from ``marp`` only the catalogs
(a model's shape, a GPU's datasheet peak, memory bandwidth and size) and the layout a policy
chose. Memory stays MARP's prediction (no other memory model is in the repository) times an
error drawn per layout. docs/simulator.md ("The independent truth") has the provenance.

The model, each term from a measurement in the repository (fitted once, at first use):

1. *Per-GPU efficiency at the published operating point* (``anchors``): the published LLM
   training runs of ``bench/data/speed/throughput.csv`` (the project's step-time validation set:
   llm-foundry's MPT tables, 125M-70B on H100-80GB, A100-80GB and A100-40GB, 8-128 GPUs), each
   as its hardware FLOP utilisation: tokens/s/GPU x FLOPs per token / the GPU's dense peak.
   FLOPs per token are PaLM's model FLOPs, 6N + 12 L h T (Chowdhery et al. 2022, "PaLM",
   appendix B), N the matmul parameters, x 4/3 for full activation recomputation (one more
   forward: Korthikanti et al. 2022, sec. 5). Rows in float8 (our jobs run bf16) and rows
   published as FLOP/s (converted with other formulas) are left out. Per GPU type: piecewise
   linear in log10 N between the measured sizes (the median where a size has several rows),
   flat beyond the ends.
2. *GPU types with no published run* (L4, L40S, V100, ...): the A100-80GB curve times
   (b_t / b_A100)^alpha, capped at 1, b = memory bandwidth / dense peak (bytes per FLOP, from
   the GPU catalog's datasheet values); alpha is fitted on the two measured types, H100-80GB
   against A100-80GB at the sizes both have (least squares of ln(ratio of efficiencies) on
   ln(ratio of b)). A type starved of bandwidth per FLOP keeps less of its peak.
3. *Diminishing returns of width* (``width_factor``): each GPU's share of a step, w = tokens per
   step / GPUs, shrinks as a fixed-batch job widens; below the published runs' median share
   (w_ref) every halving of w costs a factor d_gavel per GPU: d_gavel is the per-doubling loss of
   per-GPU throughput fitted on Gavel's measured V100 throughputs at 1, 2, 4 and 8 GPUs
   (``data/traces/gavel/v100_throughputs.json``, 19 job types, least squares of ln efficiency on
   log2 GPUs through 1 at 1 GPU). Gavel measured weak scaling of CNN-era jobs; using its loss per
   doubling as the loss per halving of a GPU's work below the published runs' is our assumption
   (the published LLM runs scale flat while each GPU's share is kept: MPT-13B on 8 and on 64
   H100s, 4,792 and 4,800 tokens/s/GPU).
4. *Crossing nodes* (``node_factor``): per doubling of the nodes a job spans, the per-doubling
   loss of Megatron-LM's published weak scaling (Shoeybi et al. 2019, sec. 5.1: 39 TFLOP/s on
   one V100, 15.1 PFLOP/s on 512, 75.6 % efficiency over 9 doublings, rows MEG19-* of the same
   CSV, on a 6.25 GB/s-per-GPU fabric), raised to 6.25 / the cluster's inter-node GB/s per GPU
   (``inter_node_gbps`` of the cluster file; 25 where it says none): moving the same bytes over a
   4x slower fabric costs 4x the time. This is the cluster file's number, which MARP's
   profiles in the simulator do not get (``ProfileBook`` builds its pools without it).
5. *Layout*: the 1F1B pipeline bubble, step x (1 + (pp - 1) / (micro-batches x vpp))
   (Narayanan et al. 2021, sec. 2.2; the same textbook formula MARP uses), and full
   recomputation's extra forward (x 4/3 of the FLOPs). Nothing else of a layout is systematic
   here; what else a layout changes is in the error below.
6. *Error* (``speed_error`` sigma): ln(true / model) = sigma x (z_type + z_width x log2(n) / 3 +
   z_layout / 2), the z standard normal, drawn per (seed, job, type), (seed, job, type, n) and
   (seed, job, type, layout): the spread grows with width (sd sigma x 1.1 on one GPU, x 1.5 on 8,
   x 2.3 on 64) and differs between two layouts at one count. *Memory* (``memory_error``): the
   true peak of a layout is MARP's predicted peak x exp(sigma_m z), z per (seed, job, type,
   layout): one layout of a job may fit where another at the same count does not.

7. *Mixed layouts* (one job over several GPU types, ``mixed_step_s``; issue 33): each (stage,
   type) part of the layout computes its own work -- the tokens its ranks carry a step (their
   data-parallel width x local micro-batch x micro-batches x sequence) times the FLOPs per token of
   the stage's blocks (6 x their matmul parameters + 12 L_s h T, the LM head's on the last stage)
   -- on its own GPUs at its type's efficiency (terms 1-2, at the whole model's size), its width
   term (3, for the part's share of the work) and the node term (4, the nodes the whole job spans,
   over the part's own fabric). A stage ends when its slowest type does (uneven data parallelism:
   the slowest rank's pace given its local batch); a pipeline runs at its slowest stage, times the
   1F1B bubble of term 5 (P stages, m micro-batches). One stage of one type reduces to terms 1-5
   exactly. The error is term 6 per type (each type's parts get its z_type, its z_width at the
   type's GPU count in the job and a z_layout of this layout); memory is each share's predicted
   peak x exp(sigma_m z), z per (seed, job, type, layout).

What this model does not know and MARP does: the communication volume of each collective, ZeRO
stages, micro-batch sizes. What it knows and MARP does not: the measured efficiencies per type
and size, the measured losses of width, and the cluster's own inter-node bandwidth.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from statistics import median

import marp
from has.cluster_spec import ClusterSpec

# The repository's files (a checkout: `frenzy simulate` reads traces from it too).
_ROOT = Path(__file__).resolve().parents[3]
SPEED_CSV = _ROOT / "bench" / "data" / "speed" / "throughput.csv"
GAVEL_JSON = _ROOT / "data" / "traces" / "gavel" / "v100_throughputs.json"
REFERENCE_TYPE = "A100-80GB"  # the curve of the types with no published run (and the mapping's GPU)
DEFAULT_INTER_NODE_GBPS = 25.0  # GB/s per GPU where the cluster file names none (200 Gb/s HDR per GPU)
RECOMPUTE_FULL = 4.0 / 3.0  # full recomputation: one more forward, 8/6 of the model FLOPs


class TruthDataError(ValueError):
    """The measurements the independent truth is built from are missing or unreadable."""


# ----- FLOPs per token ----------------------------------------------------------------------


def matmul_params(n_layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, mlp: str, vocab: int) -> float:
    """Parameters that take part in a token's matmuls: per layer Q and O (h x h each), K and V
    (h x kv_heads x head_dim each), the MLP (2 h ffn; 3 with a gated unit), and the LM head
    (vocab x h). The input embedding is a lookup (no FLOPs)."""
    head_dim = hidden / heads
    attn = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    mlp_p = (3 if mlp in ("swiglu", "geglu") else 2) * hidden * ffn
    return n_layers * (attn + mlp_p) + vocab * hidden


def flops_per_token(params: float, n_layers: int, hidden: int, seq_len: int) -> float:
    """PaLM's model FLOPs per trained token (Chowdhery et al. 2022, appendix B): 6N + 12 L h T."""
    return 6.0 * params + 12.0 * n_layers * hidden * seq_len


def model_flops(model: marp.ModelSpec, seq_len: int) -> tuple[float, float]:
    """(matmul parameters, FLOPs per token) of a catalog model (dense: a mixture of experts
    counts its top_k experts' MLPs)."""
    ffn = model.ffn
    if model.experts and model.top_k:
        ffn = model.expert_ffn * model.top_k + model.shared_ffn
    p = matmul_params(model.n_layers, model.hidden, model.heads, model.kv_heads or model.heads, ffn, model.mlp,
                      model.vocab)  # fmt: skip
    return p, flops_per_token(p, model.n_layers, model.hidden, seq_len)


# ----- the fits -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    """One published run as a hardware FLOP utilisation."""

    row: str
    gpu: str
    params: float
    hfu: float
    tokens_per_gpu_step: float  # each GPU's share of a step (global batch x seq / GPUs)


@dataclass(frozen=True)
class Fits:
    """Everything the model takes from the measurements (docs/simulator.md lists the values)."""

    anchors: tuple[Anchor, ...]
    curves: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]  # type -> (log10 N, hfu) knots
    alpha: float  # exponent of the bandwidth-per-FLOP rule for unmeasured types
    d_gavel: float  # per-doubling per-GPU throughput factor (Gavel, V100, 1-8 GPUs)
    w_ref: float  # median tokens per GPU per step of the published runs
    d_nodes: float  # per doubling of nodes at REF_FABRIC_GBPS (Shoeybi et al. 2019)
    ref_fabric_gbps: float
    gavel_types: int = 0
    notes: dict[str, float] = field(default_factory=dict)


def _read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise TruthDataError(f"the independent truth needs {path} (a repository checkout): {exc}") from exc


def _peak(gpu: str, precision: str) -> float:
    return marp.get_gpu(gpu).peak_tflops(precision) * 1e12


def fit_anchors(rows: list[dict[str, str]]) -> list[Anchor]:
    """The published runs usable as anchors: tokens/s/GPU given, not float8."""
    out = []
    for r in rows:
        if not r.get("measured_tokens_per_s_per_gpu") or r.get("fp8", "no") == "yes":
            continue
        layers, hidden, seq = int(r["n_layers"]), int(r["hidden"]), int(r["seq_len"])
        p = matmul_params(layers, hidden, int(r["heads"]), int(r["kv_heads"] or r["heads"]), int(r["ffn"]),
                          r["mlp_act"], int(r["vocab"]))  # fmt: skip
        flops = flops_per_token(p, layers, hidden, seq) * (RECOMPUTE_FULL if r["recompute"] == "full" else 1.0)
        gpu = marp.get_gpu(r["gpu"]).name
        hfu = float(r["measured_tokens_per_s_per_gpu"]) * flops / _peak(gpu, "bf16")
        share = int(r["global_batch"]) * seq / int(r["num_gpus"])
        out.append(Anchor(r["id"], gpu, p, hfu, share))
    return out


def fit_curves(anchors: list[Anchor]) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Per measured GPU type: knots (log10 N, median HFU of the runs of that size)."""
    by: dict[str, dict[float, list[float]]] = {}
    for a in anchors:
        by.setdefault(a.gpu, {}).setdefault(round(math.log10(a.params), 3), []).append(a.hfu)
    return {t: (tuple(sorted(sizes)), tuple(median(sizes[k]) for k in sorted(sizes))) for t, sizes in by.items()}


def interpolate(knots: tuple[tuple[float, ...], tuple[float, ...]], x: float) -> float:
    """Piecewise linear through the knots, flat beyond the ends."""
    xs, ys = knots
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    k = bisect_right(xs, x) - 1
    f = (x - xs[k]) / (xs[k + 1] - xs[k])
    return ys[k] + f * (ys[k + 1] - ys[k])


def bytes_per_flop(gpu: str) -> float:
    g = marp.get_gpu(gpu)
    return g.mem_bw_gbps * 1e9 / (g.bf16_tflops * 1e12 if g.bf16_tflops > 0 else g.fp16_tflops * 1e12)


def fit_alpha(curves: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]) -> float:
    """The exponent of (b_t / b_ref) that carries the reference curve to another type, fitted
    on the measured types against the reference at the reference's measured sizes."""
    ref = curves[REFERENCE_TYPE]
    num = den = 0.0
    for t, knots in curves.items():
        if t == REFERENCE_TYPE:
            continue
        x = math.log(bytes_per_flop(t) / bytes_per_flop(REFERENCE_TYPE))
        if abs(x) < 1e-9:
            continue  # the same bandwidth per FLOP (A100-40GB vs 80GB): says nothing of alpha
        lo, hi = knots[0][0], knots[0][-1]
        for size, hfu_ref in zip(*ref, strict=True):
            if lo <= size <= hi:
                y = math.log(interpolate(knots, size) / hfu_ref)
                num, den = num + x * y, den + x * x
    if den == 0.0:
        raise TruthDataError("no measured type to fit the bandwidth rule on")
    return num / den


def fit_gavel(path: Path) -> tuple[float, int]:
    """Per-doubling factor of per-GPU throughput from Gavel's isolated V100 throughputs: least
    squares of ln(thr(n) / (n thr(1))) on log2 n (through 0 at n = 1), over every job type measured
    at 1 GPU and more. -> (factor, job types)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TruthDataError(f"the independent truth needs {path}: {exc}") from exc
    table = raw.get("v100", raw)
    by: dict[str, dict[int, float]] = {}
    for key, thr in table.items():
        name, n = ast.literal_eval(key)
        by.setdefault(name, {})[int(n)] = float(thr)
    num = den = 0.0
    types = 0
    for m in by.values():
        if 1 not in m or len(m) < 2:
            continue
        types += 1
        for n, thr in m.items():
            if n > 1:
                x, y = math.log2(n), math.log(thr / (n * m[1]))
                num, den = num + x * y, den + x * x
    return math.exp(num / den), types


def fit_nodes(rows: list[dict[str, str]]) -> tuple[float, float]:
    """Per-doubling factor of per-GPU throughput across nodes and the fabric it was measured on
    (GB/s per GPU): Shoeybi et al. 2019, one V100 vs 512 (rows MEG19-1.2B-1GPU, MEG19-8.3B-512)."""
    by = {r["id"]: r for r in rows}
    try:
        one, many = by["MEG19-1.2B-1GPU"], by["MEG19-8.3B-512"]
    except KeyError as exc:
        raise TruthDataError(f"{SPEED_CSV}: row {exc} is missing") from exc
    eff = float(many["measured_value"]) / float(one["measured_value"])  # TFLOP/s per GPU, both
    return eff ** (1.0 / math.log2(int(many["num_gpus"]))), float(many["inter_node_gbps"])


@lru_cache(maxsize=1)
def fits() -> Fits:
    """The fitted constants (read and fitted once per process)."""
    rows = _read_rows(SPEED_CSV)
    anchors = fit_anchors(rows)
    curves = fit_curves(anchors)
    d_gavel, gavel_types = fit_gavel(GAVEL_JSON)
    d_nodes, fabric = fit_nodes(rows)
    return Fits(
        anchors=tuple(anchors), curves=curves, alpha=fit_alpha(curves), d_gavel=d_gavel,
        w_ref=median(a.tokens_per_gpu_step for a in anchors), d_nodes=d_nodes, ref_fabric_gbps=fabric,
        gavel_types=gavel_types,
    )  # fmt: skip


# ----- the truth ----------------------------------------------------------------------------


def efficiency(gpu: str, params: float) -> float:
    """Hardware FLOP utilisation of ``gpu`` at the published operating point for a model of
    ``params`` matmul parameters (terms 1 and 2 of the module docstring)."""
    f = fits()
    x = math.log10(params)
    knots = f.curves.get(gpu)
    if knots is not None:
        return interpolate(knots, x)
    ratio = min(1.0, bytes_per_flop(gpu) / bytes_per_flop(REFERENCE_TYPE))
    return interpolate(f.curves[REFERENCE_TYPE], x) * ratio**f.alpha


def width_factor(tokens_per_step: float, n: int) -> float:
    """Per-GPU throughput factor of spreading a step's tokens over ``n`` GPUs (term 3): 1 while
    each GPU's share is at least the published runs' median, d_gavel per halving below it."""
    f = fits()
    share = tokens_per_step / n
    return f.d_gavel ** max(0.0, math.log2(f.w_ref / share))


def node_factor(nodes: int, inter_node_gbps: float) -> float:
    """Per-GPU throughput factor of spanning ``nodes`` nodes over this fabric (term 4)."""
    if nodes <= 1:
        return 1.0
    f = fits()
    return f.d_nodes ** (math.log2(nodes) * f.ref_fabric_gbps / inter_node_gbps)


def bubble(layout: marp.Layout) -> float:
    """The 1F1B pipeline bubble: step x (1 + (pp - 1) / (micro-batches x vpp))."""
    if layout.pp <= 1:
        return 1.0
    return 1.0 + (layout.pp - 1) / (max(layout.grad_accum, 1) * max(layout.vpp, 1))


def layout_key(layout: marp.Layout) -> str:
    return (f"{layout.tp}/{layout.pp}/{layout.dp}/{layout.cp}/{layout.vpp}/{layout.ep}/z{layout.zero_stage}/"
            f"m{layout.micro_batch}/a{layout.grad_accum}/{layout.recompute}/{int(layout.sp)}/{layout.shard_degree}")  # fmt: skip


def mixed_key(lay: marp.mixed.MixedLayout) -> str:
    """A mixed layout's identity for its error draws: shape, states, and every stage's blocks,
    tp and per-type ranks, micro-batch and accumulation."""
    stages = ";".join(f"{st.first_layer}-{st.last_layer}/tp{st.tp}/"
                      + ",".join(f"{s.gpu_type}x{s.gpus}m{s.micro_batch}a{s.grad_accum}" for s in st.shares)
                      for st in lay.stages)  # fmt: skip
    return f"mixed:{lay.kind}/z{lay.zero_stage}/{lay.recompute}/m{lay.micro_batches}/{stages}"


class IndependentTruth:
    """The true step time and memory factor of a job's layouts on one cluster (see the module
    docstring); seeded like the engine's other factors, so every policy meets the same truth."""

    name = "independent"

    def __init__(self, spec: ClusterSpec, seed: int = 0, speed_error: float = 0.0, memory_error: float = 0.0) -> None:
        fits()  # fail early when the measurements are missing
        self.seed = seed
        self.speed_error = speed_error
        self.memory_error = memory_error
        self.per_node: dict[str, int] = {}
        self.fabric: dict[str, float] = {}
        for g in spec.groups:
            t = marp.get_gpu(g.gpu).name
            self.per_node[t] = max(self.per_node.get(t, 0), g.gpus_per_node)
            gbps = g.inter_node_gbps if g.inter_node_gbps is not None else DEFAULT_INTER_NODE_GBPS
            self.fabric[t] = min(self.fabric.get(t, math.inf), gbps)  # a mixed type: its slowest fabric
        self._model: dict[tuple[str, int], tuple[float, float]] = {}
        self._z: dict[str, float] = {}

    def _normal(self, key: str) -> float:
        z = self._z.get(key)
        if z is None:
            z = self._z[key] = random.Random(f"{self.seed}:indep:{key}").gauss(0.0, 1.0)
        return z

    def model_step_s(self, model_name: str, recipe: marp.TrainingRecipe, gpu_type: str, layout: marp.Layout) -> float:
        """Seconds per step before the error: the step's FLOPs over n GPUs at the type's measured
        efficiency, times the width, node and layout terms."""
        params, per_token = self._flops(model_name, recipe.seq_len)
        n = layout.num_gpus
        tokens = float(recipe.seq_len * recipe.global_batch)
        flops = tokens * per_token * (RECOMPUTE_FULL if layout.recompute == "full" else 1.0)
        rate = n * _peak(gpu_type, recipe.precision) * efficiency(gpu_type, params)
        nodes = math.ceil(n / max(self.per_node.get(gpu_type, 8), 1))
        rate *= width_factor(tokens, n) * node_factor(nodes, self.fabric.get(gpu_type, DEFAULT_INTER_NODE_GBPS))
        return flops / rate * bubble(layout)

    def mixed_parts(self, model_name: str, recipe: marp.TrainingRecipe,
                    lay: marp.mixed.MixedLayout) -> list[tuple[int, str, int, float]]:  # fmt: skip
        """(stage, GPU type, GPUs of that type in the job, seconds per step before the error) of
        every (stage, type) part of a mixed layout (term 7): the part's work at its own rate."""
        model = marp.get_model(model_name)
        params, _ = self._flops(model_name, recipe.seq_len)
        head = float(model.vocab * model.hidden)
        per_layer = (params - head) / model.n_layers
        full = flops_per_token(params, model.n_layers, model.hidden, recipe.seq_len)
        rc = RECOMPUTE_FULL if lay.recompute == "full" else 1.0
        by_type = lay.gpus_by_type
        nodes = sum(math.ceil(n / max(self.per_node.get(t, 8), 1)) for t, n in by_type.items())
        out = []
        for st in lay.stages:
            blocks = st.last_layer - st.first_layer + 1
            stage_params = blocks * per_layer + (head if st.head else 0.0)
            per_token = flops_per_token(stage_params, blocks, model.hidden, recipe.seq_len)
            for s in st.shares:
                tokens = float(s.gpus // st.tp * s.micro_batch * s.grad_accum * recipe.seq_len)
                rate = s.gpus * _peak(s.gpu_type, recipe.precision) * efficiency(s.gpu_type, params)
                rate *= width_factor(tokens * per_token / full, s.gpus)
                rate *= node_factor(nodes, self.fabric.get(s.gpu_type, DEFAULT_INTER_NODE_GBPS))
                out.append((st.index, s.gpu_type, by_type[s.gpu_type], tokens * per_token * rc / rate))
        return out

    def mixed_step_s(self, job_id: str, model_name: str, recipe: marp.TrainingRecipe,
                     lay: marp.mixed.MixedLayout) -> float:  # fmt: skip
        """True seconds per step of a mixed layout (term 7): each part's time times its type's
        error; a stage at its slowest type, the step at the slowest stage x the 1F1B bubble."""
        key = mixed_key(lay)
        stage_s: dict[int, float] = {}
        for stage, gpu_type, n, t in self.mixed_parts(model_name, recipe, lay):
            t *= self._error(job_id, gpu_type, n, key)
            stage_s[stage] = max(stage_s.get(stage, 0.0), t)
        p = len(lay.stages)
        fill = 1.0 + (p - 1) / max(lay.micro_batches, 1) if p > 1 else 1.0
        return max(stage_s.values()) * fill

    def mixed_memory_factor(self, job_id: str, gpu_type: str, lay: marp.mixed.MixedLayout) -> float:
        """True / predicted peak of the ranks of ``gpu_type`` in a mixed layout: exp(sigma_m z)."""
        if self.memory_error <= 0:
            return 1.0
        return math.exp(self.memory_error * self._normal(f"mem:{job_id}:{gpu_type}:{mixed_key(lay)}"))

    def _flops(self, model_name: str, seq_len: int) -> tuple[float, float]:
        key = (model_name, seq_len)
        hit = self._model.get(key)
        if hit is None:
            hit = self._model[key] = model_flops(marp.get_model(model_name), seq_len)
        return hit

    def _error(self, job_id: str, gpu_type: str, n: int, layout_id: str) -> float:
        """exp(sigma (z_type + z_width log2(n) / 3 + z_layout / 2)); 1 without an error."""
        if self.speed_error <= 0:
            return 1.0
        z = (self._normal(f"type:{job_id}:{gpu_type}") + self._normal(f"width:{job_id}:{gpu_type}:{n}") * math.log2(n) / 3
             + self._normal(f"layout:{job_id}:{gpu_type}:{layout_id}") / 2)  # fmt: skip
        return math.exp(self.speed_error * z)

    def speed_factor(self, job_id: str, gpu_type: str, layout: marp.Layout) -> float:
        """exp(sigma (z_type + z_width log2(n) / 3 + z_layout / 2)); 1 without an error."""
        return self._error(job_id, gpu_type, layout.num_gpus, layout_key(layout))

    def step_s(self, job_id: str, model_name: str, recipe: marp.TrainingRecipe, gpu_type: str,
               layout: marp.Layout) -> float:  # fmt: skip
        """True seconds per step of this layout (before the engine's per-job runtime noise)."""
        return self.model_step_s(model_name, recipe, gpu_type, layout) * self.speed_factor(job_id, gpu_type, layout)

    def memory_factor(self, job_id: str, gpu_type: str, layout: marp.Layout) -> float:
        """True / predicted peak memory of this layout: exp(sigma_m z), one z per layout."""
        if self.memory_error <= 0:
            return 1.0
        return math.exp(self.memory_error * self._normal(f"mem:{job_id}:{gpu_type}:{layout_key(layout)}"))


__all__ = [
    "Anchor",
    "Fits",
    "IndependentTruth",
    "TruthDataError",
    "bubble",
    "efficiency",
    "fits",
    "flops_per_token",
    "matmul_params",
    "mixed_key",
    "model_flops",
    "node_factor",
    "width_factor",
]
