"""Job traces for the simulator: our own format, readers for public traces, a generator.

Role: turn a file (or a seed) into a list of ``TraceJob`` — LLM training jobs as a
user would submit them (model, recipe, tokens to train, the GPUs they would have
asked for). Three file formats are read, detected from the file's first line:

* ours (``frenzy-trace``): CSV with the header ``job_id,submit_s,model,seq_len,
  global_batch,tokens,gpu_type,gpus`` and optionally the columns ``priority`` (an integer,
  -100..100 as submissions take it; absent: 0), ``deadline_s`` (seconds from submission the job
  must finish within, as ``frenzy submit --deadline``; empty: none) and ``objective`` (time, cost
  or gpu-hours; empty: time), in that order (``#`` lines are comments; ``gpu_type`` may be
  empty);
* Gavel's Philly-derived ``.trace`` files (Narayanan et al., OSDI'20; tab-separated,
  7 fields: job_type, command, num_steps_arg, needs_data_dir, total_steps,
  arrival_time, scale_factor);
* Pollux's workload CSVs (Qiao et al., OSDI'21; header
  ``name,time,application,num_replicas,batch_size``).

Public traces describe CNN-era jobs, so each is mapped to an LLM job deterministically
(``LlmMapper``; the rule is written out in docs/simulator.md): the arrival time and the
requested GPU count (rounded down to a power of two, at most 64) are kept; the job's
length in GPU-time on the *reference GPU* is kept; the model is a catalog model whose
memory needs that many reference GPUs (MARP's smallest plan); the length becomes a token
budget through MARP's step-time estimate of that model on that many reference GPUs.

Deadlines and objectives for a trace that has none (synthetic jobs, public traces) come from one
seeded rule, ``with_goals`` (docs/simulator.md, "Deadlines and dollars").

Bad input raises ``TraceError`` naming the file, line and field.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import marp

OWN_HEADER = ("job_id", "submit_s", "model", "seq_len", "global_batch", "tokens", "gpu_type", "gpus")
OWN_HEADER_PRIORITY = (*OWN_HEADER, "priority")  # the optional column
OPTIONAL_COLUMNS = ("priority", "deadline_s", "objective")  # optional, in this order, after OWN_HEADER
OBJECTIVES = ("time", "cost", "gpu-hours")  # marp.objectives.OBJECTIVES, has.queued.OBJECTIVES
MIN_PRIORITY, MAX_PRIORITY = -100, 100  # what a submission may ask (frenzy.rpc.jobspec)
POLLUX_HEADER = ("name", "time", "application", "num_replicas", "batch_size")

# The reference GPU of the mapping: public traces' lengths become GPU-time on this type.
REFERENCE_GPU = "A100-80GB"
REFERENCE_GPUS_PER_NODE = 8
MAX_REQUEST = 64
DEFAULT_GLOBAL_BATCH = 64
DEFAULT_SEQ_LEN = 2048

# Catalog models the mapping may pick, in a fixed order (the choice among equals is a
# hash of the job id into this order, so it does not depend on Python's hash seed).
MAPPING_MODELS: tuple[str, ...] = (
    "gpt2-124m", "gpt2-355m", "qwen2.5-0.5b", "gpt2-774m", "llama-3.2-1b", "qwen2.5-1.5b",
    "gpt2-1.5b", "llama-3.2-3b", "qwen2.5-3b", "llama-2-7b", "mistral-7b", "qwen2.5-7b",
    "llama-3-8b", "llama-2-13b", "qwen2.5-14b", "qwen2.5-32b", "llama-2-70b", "qwen2.5-72b",
)  # fmt: skip

# Pollux's workloads carry no length (jobs run to a target accuracy). We give each
# application the GPU-hours on the reference GPU of the size bin Sia (SOSP'23, sec. 4)
# puts it in: S = 0-1 h (cifar10, ncf), M = 1-10 h (bert, deepspeech2),
# L = 10-100 h (yolov3), XL > 100 h (imagenet; we take the bottom of the bin).
POLLUX_GPU_HOURS: dict[str, float] = {
    "cifar10": 0.5, "ncf": 0.5, "bert": 4.0, "deepspeech2": 6.0, "yolov3": 24.0, "imagenet": 100.0,
}  # fmt: skip


class TraceError(ValueError):
    """A malformed or unusable trace; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceJob:
    """One LLM training job as submitted: what to train, how much, what the user would ask for.

    ``gpus`` (and ``gpu_type``, possibly empty) are the user's own request, which only the
    request-following baseline (opportunistic) uses; Frenzy's policies never read them.
    """

    job_id: str
    submit_s: float
    model: str
    seq_len: int
    global_batch: int
    tokens: int
    gpus: int
    gpu_type: str = ""
    origin: str = ""  # where it came from, e.g. "gavel 2869ce.trace:12 (ResNet-50 ...)"
    priority: int = 0  # its class (``has.QueuedJob.priority``): higher classes go first
    # seconds from its submission within which it must finish (``frenzy submit --deadline``); None: none
    deadline_s: float | None = None
    objective: str = "time"  # what orders its plans (``frenzy submit --objective``)

    def recipe(self) -> marp.TrainingRecipe:
        return marp.TrainingRecipe(seq_len=self.seq_len, global_batch=self.global_batch)

    @property
    def train_steps(self) -> int:
        return max(1, math.ceil(self.tokens / (self.seq_len * self.global_batch)))


# ----- the LLM mapping ---------------------------------------------------------------


def _seq_len_for(model: marp.ModelSpec) -> int:
    return min(DEFAULT_SEQ_LEN, model.max_positions)


@cache
def _reference_plans(model_name: str) -> dict[int, float]:
    """GPU count → tokens/s of MARP's best plan for ``model_name`` on the reference GPU."""
    model = marp.get_model(model_name)
    recipe = marp.TrainingRecipe(seq_len=_seq_len_for(model), global_batch=DEFAULT_GLOBAL_BATCH)
    pool = marp.GpuPool(REFERENCE_GPU, MAX_REQUEST, REFERENCE_GPUS_PER_NODE)
    out: dict[int, float] = {}
    for plan in marp.enumerate_plans(model, recipe, [pool], max_plans=None).plans:
        if plan.num_gpus not in out or plan.tokens_per_s > out[plan.num_gpus]:
            out[plan.num_gpus] = plan.tokens_per_s
    return out


def min_reference_gpus(model_name: str) -> int | None:
    """Fewest reference GPUs MARP can fit ``model_name`` on (None: not even 64)."""
    counts = _reference_plans(model_name)
    return min(counts) if counts else None


def round_request(n: int) -> int:
    """A requested GPU count as the mapping keeps it: the power of two ≤ n, capped at 64."""
    if n < 1:
        raise ValueError(f"GPU count must be >= 1, got {n}")
    return min(MAX_REQUEST, 1 << (n.bit_length() - 1))


def models_for_request(gpus: int) -> tuple[str, ...]:
    """The mapping's candidates for a ``gpus``-GPU request: models whose smallest plan on the
    reference GPU uses the most GPUs not above ``gpus`` (so they need about that many)."""
    fits = [(min_reference_gpus(m), m) for m in MAPPING_MODELS]
    fits = [(n, m) for n, m in fits if n is not None and n <= gpus]
    if not fits:
        raise TraceError(f"no catalog model fits {gpus} {REFERENCE_GPU}")
    top = max(n for n, _ in fits)
    return tuple(m for n, m in fits if n == top)


def llm_job(job_id: str, submit_s: float, requested: int, gpu_seconds_ref: float, origin: str) -> TraceJob:
    """The deterministic LLM job for a public-trace job (see the module docstring)."""
    gpus = round_request(requested)
    candidates = models_for_request(gpus)
    model_name = candidates[zlib.crc32(job_id.encode()) % len(candidates)]
    model = marp.get_model(model_name)
    runtime_ref = gpu_seconds_ref / gpus
    tokens = max(1, int(runtime_ref * _reference_tps(model_name, gpus)))
    return TraceJob(job_id, float(submit_s), model_name, _seq_len_for(model), DEFAULT_GLOBAL_BATCH,
                    tokens, gpus, "", origin)  # fmt: skip


def _reference_tps(model_name: str, gpus: int) -> float:
    """Tokens/s of MARP's best plan for the model on ``gpus`` reference GPUs (no valid layout on
    exactly that many: the largest smaller count's, scaled linearly)."""
    tps = _reference_plans(model_name).get(gpus)
    if tps is None:
        n = max(c for c in _reference_plans(model_name) if c <= gpus)
        tps = _reference_plans(model_name)[n] * gpus / n
    return tps


def fit_to_cluster(jobs: Sequence[TraceJob], max_request: int, length_factor: float = 1.0) -> list[TraceJob]:
    """A mapped public trace made to fit a small cluster (docs/mixed-plans.md, "Measured in the
    simulator"): every job's request is cut to ``max_request`` GPUs and its length in reference
    GPU-time multiplied by ``length_factor``, and the job is mapped again by the same rule
    (``llm_job``: a request of 2 becomes a 7-8B model, 4 a 13-14B one), keeping its id, arrival,
    priority and goals. A job whose request is kept keeps its model (same candidates, same
    ``crc32``). Jobs already in our format are mapped jobs too: their reference GPU-time is their
    tokens over the reference tokens/s at their request."""
    if max_request < 1 or not (length_factor > 0 and math.isfinite(length_factor)):
        raise ValueError(f"fit_to_cluster: max_request >= 1 and a length factor > 0, got {max_request}, {length_factor}")
    out = []
    for j in jobs:
        gpu_seconds = j.tokens / _reference_tps(j.model, j.gpus) * j.gpus * length_factor
        new = llm_job(j.job_id, j.submit_s, min(j.gpus, max_request), gpu_seconds, j.origin)
        out.append(replace(j, model=new.model, seq_len=new.seq_len, global_batch=new.global_batch,
                           tokens=new.tokens, gpus=new.gpus))  # fmt: skip
    return out


# ----- readers -----------------------------------------------------------------------


def _gavel_throughputs(path: Path) -> dict[tuple[str, int], float]:
    """(job_type, scale_factor) → isolated steps/s on a V100, from Gavel's table (or our extract)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: cannot read Gavel throughput table: {exc}") from exc
    table = raw.get("v100", raw)
    out: dict[tuple[str, int], float] = {}
    for key, value in table.items():
        job_type, _, sf = key.strip("()").rpartition(",")
        tput = value.get("null", 0.0) if isinstance(value, dict) else float(value)
        out[(job_type.strip().strip("'\""), int(sf))] = float(tput)
    return out


def find_gavel_table(trace_path: Path) -> Path:
    """The throughput table next to (or one folder above) a Gavel trace."""
    for folder in (trace_path.parent, trace_path.parent.parent):
        for name in ("v100_throughputs.json", "simulation_throughputs.json"):
            if (folder / name).is_file():
                return folder / name
    raise TraceError(
        f"{trace_path}: Gavel trace needs its throughput table (v100_throughputs.json or "
        "simulation_throughputs.json) in the same folder or the one above"
    )


def _gavel_steps_per_s(table: dict[tuple[str, int], float], job_type: str, sf: int) -> float | None:
    """Isolated V100 throughput of ``job_type`` on ``sf`` GPUs.

    Gavel measured scale factors 1, 2, 4 and 8 only, and some pairs are 0 (not run).
    Otherwise we scale the largest measured smaller factor linearly: (sf / k) × tput(k).
    """
    for k in sorted((k for (t, k), v in table.items() if t == job_type and v > 0 and k <= sf), reverse=True):
        return table[(job_type, k)] * sf / k
    return None


def read_gavel(path: Path, lines: Iterable[str], table_path: Path | None = None) -> list[TraceJob]:
    table = _gavel_throughputs(table_path or find_gavel_table(path))
    jobs = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        where = f"{path.name}:{lineno}"
        if len(fields) != 7:
            raise TraceError(f"{where}: Gavel trace line needs 7 tab-separated fields, got {len(fields)}")
        job_type = fields[0]
        steps = _num(fields[4], where, "total_steps", int)
        arrival = _num(fields[5], where, "arrival_time", float)
        sf = _num(fields[6], where, "scale_factor", int)
        if steps <= 0 or sf <= 0 or arrival < 0:
            raise TraceError(f"{where}: total_steps and scale_factor must be > 0, arrival_time >= 0")
        tput = _gavel_steps_per_s(table, job_type, sf)
        if tput is None:
            raise TraceError(f"{where}: job_type {job_type!r} has no V100 throughput in the Gavel table")
        gpu_seconds = steps / tput * sf  # wall time on sf V100s x sf: length in GPU-time
        jobs.append(llm_job(f"{path.stem}-{lineno}", arrival, sf, gpu_seconds, f"gavel {where} ({job_type})"))
    return jobs


def read_pollux(path: Path, text: str) -> list[TraceJob]:
    jobs = []
    reader = csv.DictReader(io.StringIO(text))
    for lineno, row in enumerate(reader, start=2):
        where = f"{path.name}:{lineno}"
        app = (row.get("application") or "").strip()
        if app not in POLLUX_GPU_HOURS:
            raise TraceError(
                f"{where}: field application: unknown {app!r}; known: {sorted(POLLUX_GPU_HOURS)}"
            )
        t = _num(row.get("time"), where, "time", float)
        n = _num(row.get("num_replicas"), where, "num_replicas", int)
        if n <= 0 or t < 0:
            raise TraceError(f"{where}: num_replicas must be > 0 and time >= 0")
        name = (row.get("name") or "").strip() or f"{path.stem}-{lineno}"
        jobs.append(llm_job(name, t, n, POLLUX_GPU_HOURS[app] * 3600.0, f"pollux {where} ({app})"))
    return jobs


def _own_header(head: tuple[str, ...]) -> bool:
    """Our header: ``OWN_HEADER`` then some of ``OPTIONAL_COLUMNS``, in their order."""
    extra = head[len(OWN_HEADER):]
    return head[:len(OWN_HEADER)] == OWN_HEADER and list(extra) == [c for c in OPTIONAL_COLUMNS if c in extra]


def read_own(path: Path, text: str) -> list[TraceJob]:
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    reader = csv.DictReader(io.StringIO(body))
    head = tuple(reader.fieldnames or ())
    if not _own_header(head):
        raise TraceError(f"{path.name}: header must be {','.join(OWN_HEADER)} (optionally followed by "
                         f"{', '.join(OPTIONAL_COLUMNS)}, in that order)")  # fmt: skip
    with_priority = "priority" in head
    jobs = []
    seen: set[str] = set()
    known_models = {m.name for m in marp.list_models()}
    known_gpus = {g.name for g in marp.list_gpus()}
    for i, row in enumerate(reader, start=1):
        where = f"{path.name}: job {i}"
        job_id = (row["job_id"] or "").strip()
        if not job_id or job_id in seen:
            raise TraceError(f"{where}: field job_id: empty or duplicate ({job_id!r})")
        seen.add(job_id)
        model = (row["model"] or "").strip()
        if model not in known_models:
            raise TraceError(
                f"{where} ({job_id}): field model: unknown model {model!r} (see `frenzy models`)"
            )
        gpu_type = (row["gpu_type"] or "").strip()
        if gpu_type and gpu_type not in known_gpus:
            raise TraceError(
                f"{where} ({job_id}): field gpu_type: unknown GPU {gpu_type!r} (see `frenzy gpus`)"
            )
        job = TraceJob(
            job_id=job_id, submit_s=_num(row["submit_s"], where, "submit_s", float), model=model,
            seq_len=_num(row["seq_len"], where, "seq_len", int),
            global_batch=_num(row["global_batch"], where, "global_batch", int),
            tokens=_num(row["tokens"], where, "tokens", int), gpus=_num(row["gpus"], where, "gpus", int),
            gpu_type=gpu_type, origin=f"{path.name}:{job_id}",
            priority=_num(row["priority"] or "0", where, "priority", int) if with_priority else 0,
            deadline_s=_num(row["deadline_s"], where, "deadline_s", float) if (row.get("deadline_s") or "").strip()
            else None,
            objective=(row.get("objective") or "").strip() or "time",
        )  # fmt: skip
        if job.deadline_s is not None and not 0 < job.deadline_s < math.inf:
            raise TraceError(f"{where} ({job_id}): field deadline_s: must be a positive number of seconds")
        if job.objective not in OBJECTIVES:
            raise TraceError(f"{where} ({job_id}): field objective: one of {', '.join(OBJECTIVES)}, "
                             f"got {job.objective!r}")  # fmt: skip
        if not MIN_PRIORITY <= job.priority <= MAX_PRIORITY:
            raise TraceError(f"{where} ({job_id}): field priority: must be {MIN_PRIORITY}..{MAX_PRIORITY}")
        for name in ("seq_len", "global_batch", "tokens", "gpus"):
            if getattr(job, name) <= 0:
                raise TraceError(f"{where} ({job_id}): field {name}: must be > 0")
        if job.submit_s < 0:
            raise TraceError(f"{where} ({job_id}): field submit_s: must be >= 0")
        try:
            marp.enumerate_plans(marp.get_model(model), job.recipe(), [marp.GpuPool(REFERENCE_GPU, 8, 8)],
                                 max_plans=1)  # fmt: skip
        except marp.MarpError as exc:
            raise TraceError(f"{where} ({job_id}): {exc}") from exc
        jobs.append(job)
    return jobs


def _num(value: str | None, where: str, field: str, kind: type) -> int | float:
    try:
        if kind is int:
            f = float(value)  # type: ignore[arg-type]
            if not f.is_integer():
                raise ValueError
            return int(f)
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(f"{where}: field {field}: expected a number, got {value!r}") from None


def detect_format(first_line: str) -> str:
    """'frenzy', 'pollux' or 'gavel' from a trace file's first non-comment line."""
    head = tuple(c.strip() for c in first_line.strip().split(","))
    if _own_header(head):
        return "frenzy"
    if head == POLLUX_HEADER:
        return "pollux"
    if len(first_line.rstrip("\n").split("\t")) == 7:
        return "gavel"
    raise TraceError(
        "unrecognised trace format: expected our CSV header "
        f"({','.join(OWN_HEADER)}), Pollux's ({','.join(POLLUX_HEADER)}) or a Gavel .trace line "
        "(7 tab-separated fields)"
    )


def read_trace(path: str | Path, max_jobs: int | None = None) -> list[TraceJob]:
    """Read any supported trace (format detected from the file); jobs sorted by submit time.

    ``max_jobs`` keeps the first N jobs in file order (before sorting), as ``--max-jobs`` says.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{p}: cannot read trace: {exc}") from exc
    lines = text.splitlines(keepends=True)
    first = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), None)
    if first is None:
        raise TraceError(f"{p}: empty trace")
    fmt = detect_format(first)
    if max_jobs is not None and max_jobs < 1:
        raise TraceError(f"max_jobs must be >= 1, got {max_jobs}")
    if fmt == "gavel":
        body = [ln for ln in lines if ln.strip()]
        jobs = read_gavel(p, body[:max_jobs] if max_jobs else body)
    else:
        if max_jobs:
            kept, n = [], -1  # header + first N data lines, comments kept
            for ln in lines:
                if ln.strip() and not ln.lstrip().startswith("#"):
                    n += 1
                if n <= max_jobs:
                    kept.append(ln)
            text = "".join(kept)
        jobs = read_pollux(p, text) if fmt == "pollux" else read_own(p, text)
    if not jobs:
        raise TraceError(f"{p}: no jobs")
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def write_trace(jobs: Sequence[TraceJob], path: str | Path | None = None) -> str:
    """Our CSV format for ``jobs`` (returned, and written to ``path`` when given)."""
    out = io.StringIO()
    out.write(
        "# frenzy-trace v1: submit_s in seconds from the start; tokens to train; gpus/gpu_type = user's ask\n"
    )
    w = csv.writer(out, lineterminator="\n")
    # the optional columns only when a job has a value there: traces without them stay as they were
    used = {"priority": any(j.priority for j in jobs), "deadline_s": any(j.deadline_s is not None for j in jobs),
            "objective": any(j.objective != "time" for j in jobs)}  # fmt: skip
    extra = [c for c in OPTIONAL_COLUMNS if used[c]]
    w.writerow((*OWN_HEADER, *extra))
    for j in jobs:
        row: list[object] = [j.job_id, f"{j.submit_s:.3f}", j.model, j.seq_len, j.global_batch, j.tokens,
                             j.gpu_type, j.gpus]  # fmt: skip
        values = {"priority": j.priority, "deadline_s": "" if j.deadline_s is None else f"{j.deadline_s:.3f}",
                  "objective": j.objective}  # fmt: skip
        w.writerow([*row, *(values[c] for c in extra)])
    if path is not None:
        Path(path).write_text(out.getvalue())
    return out.getvalue()


# ----- deadlines and objectives --------------------------------------------------------

# A deadline is a slack of this many times the job's reference runtime (on its requested count of
# reference GPUs), drawn uniformly.
DEADLINE_SLACK = (1.5, 4.0)


@cache
def _reference_step_s(model_name: str, seq_len: int, global_batch: int) -> dict[int, float]:
    """GPU count -> seconds per step of MARP's best plan on that many reference GPUs (8 per node)."""
    model = marp.get_model(model_name)
    recipe = marp.TrainingRecipe(seq_len=seq_len, global_batch=global_batch)
    pool = marp.GpuPool(REFERENCE_GPU, MAX_REQUEST, REFERENCE_GPUS_PER_NODE)
    out: dict[int, float] = {}
    for plan in marp.enumerate_plans(model, recipe, [pool], max_plans=None).plans:
        out[plan.num_gpus] = min(out.get(plan.num_gpus, math.inf), plan.step_time_s)
    return out


def reference_runtime_s(job: TraceJob) -> float | None:
    """The job's runtime on its requested count of reference GPUs (the largest count MARP fits at
    or below it, scaled linearly; the smallest it fits when none is), None when no count fits."""
    steps = _reference_step_s(job.model, job.seq_len, job.global_batch)
    if not steps:
        return None
    below = [n for n in steps if n <= job.gpus]
    n = max(below) if below else min(steps)
    step = steps[n] * n / job.gpus if below else steps[n]
    return job.train_steps * step


def with_goals(jobs: Sequence[TraceJob], seed: int, deadline_share: float, cost_share: float = 0.0,
               slack: tuple[float, float] = DEADLINE_SLACK) -> list[TraceJob]:  # fmt: skip
    """Deadlines and objectives for the jobs that carry none (a job with its own keeps them), by
    one seeded rule per job, the same for synthetic and public traces: with probability
    ``deadline_share`` a deadline of U(``slack``) x its reference runtime (``reference_runtime_s``),
    and with probability ``cost_share`` the objective "cost" (else "time"). Each job's draws come
    from its own stream (``seed`` and its id), so they do not depend on the other jobs, and the jobs
    themselves (arrivals, models, lengths) are unchanged."""
    for label, share in (("deadline share", deadline_share), ("cost share", cost_share)):
        if not 0.0 <= share <= 1.0:
            raise TraceError(f"{label}: must be in [0, 1], got {share}")
    out = []
    for job in jobs:
        if job.deadline_s is not None or job.objective != "time":
            out.append(job)
            continue
        rng = random.Random(f"goals:{seed}:{job.job_id}")
        u_deadline, u_slack, u_cost = rng.random(), rng.uniform(*slack), rng.random()
        deadline = None
        if u_deadline < deadline_share:
            ref = reference_runtime_s(job)
            deadline = None if ref is None else round(u_slack * ref, 3)
        objective = "cost" if u_cost < cost_share else "time"
        out.append(replace(job, deadline_s=deadline, objective=objective))
    return out


def force_objective(jobs: Sequence[TraceJob], objective: str) -> list[TraceJob]:
    """Every job with ``objective`` (``frenzy simulate --objective``), deadlines kept."""
    if objective not in OBJECTIVES:
        raise TraceError(f"objective: one of {', '.join(OBJECTIVES)}, got {objective!r}")
    return [replace(j, objective=objective) for j in jobs]


# ----- synthetic ---------------------------------------------------------------------

DEFAULT_MIX: dict[str, float] = {
    "qwen2.5-0.5b": 3, "gpt2-774m": 2, "llama-3.2-1b": 3, "qwen2.5-1.5b": 2, "llama-3.2-3b": 2,
    "llama-2-7b": 2, "mistral-7b": 1, "llama-3-8b": 1, "llama-2-13b": 1, "qwen2.5-14b": 1,
    "qwen2.5-32b": 0.5, "llama-2-70b": 0.25,
}  # fmt: skip


def synthetic(
    n_jobs: int,
    seed: int = 0,
    jobs_per_hour: float = 20.0,
    mix: dict[str, float] | None = None,
    median_gpu_hours: float = 4.0,
    sigma: float = 1.2,
    deadline_share: float = 0.0,
    cost_share: float = 0.0,
) -> list[TraceJob]:
    """A seeded synthetic trace: Poisson arrivals, a weighted model mix, log-normal lengths.

    Each job asks for its model's smallest reference-GPU count times 1, 2 or 4 (what users
    do: a bit more than the minimum), and its length in reference GPU-hours is log-normal
    (median ``median_gpu_hours``, shape ``sigma``), turned into tokens as in the mapping.
    ``deadline_share`` / ``cost_share`` > 0 draw deadlines and objectives (``with_goals``, its
    own random streams: the jobs are the same as without).
    """
    rng = random.Random(seed)
    mix = dict(mix or DEFAULT_MIX)
    names = sorted(mix)
    weights = [mix[n] for n in names]
    t = 0.0
    jobs = []
    for i in range(n_jobs):
        t += rng.expovariate(jobs_per_hour / 3600.0)
        name = rng.choices(names, weights)[0]
        base = min_reference_gpus(name)
        if base is None:
            raise TraceError(f"synthetic mix: {name} fits no {REFERENCE_GPU} count up to {MAX_REQUEST}")
        gpus = min(MAX_REQUEST, base * rng.choice((1, 1, 2, 4)))
        gpu_h = rng.lognormvariate(math.log(median_gpu_hours), sigma)
        tps = _reference_plans(name).get(gpus) or _reference_plans(name)[base] * gpus / base
        model = marp.get_model(name)
        tokens = max(1, int(gpu_h * 3600.0 / gpus * tps))
        jobs.append(TraceJob(f"syn-{i}", round(t, 3), name, _seq_len_for(model), DEFAULT_GLOBAL_BATCH,
                             tokens, gpus, "", f"synthetic seed={seed}"))  # fmt: skip
    if deadline_share > 0 or cost_share > 0:
        return with_goals(jobs, seed, deadline_share, cost_share)
    return jobs


__all__ = [
    "MAPPING_MODELS",
    "POLLUX_GPU_HOURS",
    "REFERENCE_GPU",
    "TraceError",
    "TraceJob",
    "detect_format",
    "fit_to_cluster",
    "force_objective",
    "reference_runtime_s",
    "with_goals",
    "llm_job",
    "min_reference_gpus",
    "models_for_request",
    "read_trace",
    "round_request",
    "synthetic",
    "write_trace",
]
