"""The launch contract of a mixed plan: what each rank is told about its share, in five variables.

One job over several GPU types gives ranks different work: a rank on a faster type takes a larger
slice of the global batch (uneven data parallelism), a pipeline stage on a type takes more or fewer
transformer blocks (uneven pipeline stages). The agent's launcher says so to every rank through the
environment; the training script reads it back with ``frenzy.train``. This module is the one place
that names the variables, parses them and renders them, so both sides agree by construction. Pure:
no I/O, no torch; the caller passes the environment as a mapping.

=========================  ============================================================  ========
variable                   value                                                         example
=========================  ============================================================  ========
FRENZY_STAGE               pipeline stage of this rank, 0 first (0 without a pipeline)     ``1``
FRENZY_STAGE_LAYERS        first and last transformer block of the stage, inclusive,      ``3-3``
                           ``FIRST-LAST`` (the whole model, ``0-(L-1)``, without one)
FRENZY_LOCAL_MICRO_BATCH   samples in one forward/backward of this rank                    ``3``
FRENZY_LOCAL_GRAD_ACCUM    micro-steps per optimizer step on this rank (under a pipeline:  ``2``
                           micro-batches per step)
FRENZY_LOSS_SCALE          this rank's share of the global batch, s_i, as an exact         ``3/8``
                           fraction (a decimal is accepted when it is exact)
=========================  ============================================================  ========

All five are set, or none: none means a homogeneous job, trained exactly as without Frenzy. torchrun
gives every local rank of a node the same environment, and one node may hold ranks whose shares
differ (two pipeline stages on one 8-GPU node); so each variable holds either one value, for every
local rank of the node, or a comma-separated list with one value per local rank, picked by
``LOCAL_RANK`` (``FRENZY_STAGE=0,0,1,1``).

The maths (the letters of docs/mixed-plans.md's planning section: b micro-batch, m micro-batches).
A global batch of B samples is split over the W ranks of a data-parallel group; rank i runs m_i
micro-steps (accumulation) of b_i samples each, so its local batch is b_i * m_i, its share of the
global batch s_i = b_i * m_i / B (``FRENZY_LOSS_SCALE``), and sum_i b_i * m_i = B. The homogeneous
recipe's gradient is the global-batch mean

    g = (1/B) * sum_{x in batch} grad l_x.

A training script's loss on micro-step k of rank i is the micro-batch mean
L_ik = (1/b_i) * sum_{x in (i,k)} l_x. If rank i back-propagates c_i * L_ik at every micro-step, it
accumulates G_i = (c_i / b_i) * sum_{x on rank i} grad l_x, and

    sum_i G_i = g   exactly when   c_i = b_i / B = s_i / m_i   for every i,

that is: weight each rank's loss by its share of the global batch (divided by its number of
micro-steps, as ``loss / grad_accum`` does) and SUM the ranks' gradients. Averaging the ranks'
mean gradients instead would weight every rank alike, so one sample of a rank with local batch 2
would count three times one sample of a rank with local batch 6. DDP's all-reduce and FSDP's
reduce-scatter do not sum, they average: they divide the sum by W. Hence the factor under them is

    c_i = W * b_i / B = W * s_i / m_i,

and with equal shares (s_i = 1 / W) it is 1 / m_i: the familiar ``loss / grad_accum`` of plain
training, which is what ``frenzy.train`` applies when the contract is absent. Summing the scaled
losses of a step over its micro-steps and averaging them over the group gives the global-batch loss,
for logging. Under a pipeline, the loss is computed on the last stage only: there b_i is the
pipeline's micro-batch and m_i the number of micro-batches in a step, the schedule must not divide
the gradients by that number again, and the earlier stages receive the scaled gradients through the
activations; W is the data-parallel width of the pipeline (the number of its replicas).

The shares are in samples: a loss averaged over a number of tokens that varies between micro-batches
(padding masks, packing) would need shares in tokens, which this contract does not carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

STAGE = "FRENZY_STAGE"
STAGE_LAYERS = "FRENZY_STAGE_LAYERS"
LOCAL_MICRO_BATCH = "FRENZY_LOCAL_MICRO_BATCH"
LOCAL_GRAD_ACCUM = "FRENZY_LOCAL_GRAD_ACCUM"
LOSS_SCALE = "FRENZY_LOSS_SCALE"
# In the order a reader meets them; the launcher sets all of them or none.
NAMES: tuple[str, ...] = (STAGE, STAGE_LAYERS, LOCAL_MICRO_BATCH, LOCAL_GRAD_ACCUM, LOSS_SCALE)

# Set by torchrun for every worker; they pick a value out of a per-local-rank list.
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"


class ContractError(ValueError):
    """A malformed or inconsistent launch contract; the message names the variable and the value."""


@dataclass(frozen=True)
class RankContract:
    """One rank's share of a mixed plan, as the five variables say it."""

    stage: int
    first_layer: int
    last_layer: int
    local_micro_batch: int
    local_grad_accum: int
    loss_scale: Fraction  # s_i = b_i * m_i / B: this rank's share of its data-parallel group's global batch

    def __post_init__(self) -> None:
        for name, low in (("stage", 0), ("first_layer", 0), ("local_micro_batch", 1), ("local_grad_accum", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ContractError(f"{name} must be an integer >= {low}, got {value!r}")
        if isinstance(self.last_layer, bool) or not isinstance(self.last_layer, int) or self.last_layer < self.first_layer:
            raise ContractError(f"last_layer must be an integer >= first_layer ({self.first_layer}), got {self.last_layer!r}")
        if not isinstance(self.loss_scale, Fraction) or not 0 < self.loss_scale <= 1:
            raise ContractError(f"loss_scale must be a Fraction in (0, 1], got {self.loss_scale!r}")
        if self.global_batch.denominator != 1:
            # A share that does not divide this rank's samples into a whole global batch is a
            # launcher bug or a rounded decimal; training on it would silently weight ranks wrongly.
            raise ContractError(
                f"{LOSS_SCALE}={_fraction_text(self.loss_scale)} with a local batch of {self.local_batch} "
                f"({LOCAL_MICRO_BATCH}={self.local_micro_batch} x {LOCAL_GRAD_ACCUM}={self.local_grad_accum}) "
                f"implies a global batch of {float(self.global_batch):g}, not a whole number: "
                f"write the share as an exact fraction (local batch / global batch)"
            )

    @property
    def local_batch(self) -> int:
        """b_i * m_i: the samples this rank contributes to one optimizer step."""
        return self.local_micro_batch * self.local_grad_accum

    @property
    def global_batch(self) -> Fraction:
        """B = b_i * m_i / s_i (a whole number once validated)."""
        return self.local_batch / self.loss_scale

    @property
    def layers(self) -> range:
        """The transformer blocks of this rank's stage, as indices."""
        return range(self.first_layer, self.last_layer + 1)


def loss_shares(local_batches: Sequence[int]) -> tuple[Fraction, ...]:
    """Each rank's share s_i (local batch / their sum) for the local batches of one data-parallel group, exactly."""
    if not local_batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in local_batches):
        raise ContractError(f"local batches must be positive integers, got {list(local_batches)!r}")
    total = sum(local_batches)
    return tuple(Fraction(b, total) for b in local_batches)


def render_rank(rank: RankContract) -> dict[str, str]:
    """The five variables of one rank."""
    return {
        STAGE: str(rank.stage),
        STAGE_LAYERS: f"{rank.first_layer}-{rank.last_layer}",
        LOCAL_MICRO_BATCH: str(rank.local_micro_batch),
        LOCAL_GRAD_ACCUM: str(rank.local_grad_accum),
        LOSS_SCALE: _fraction_text(rank.loss_scale),
    }


def render(local_ranks: Sequence[RankContract]) -> dict[str, str]:
    """The variables of one node's launch, its local ranks in ``LOCAL_RANK`` order.

    A variable on which every local rank agrees is one value; otherwise it is the list, one value
    per local rank (torchrun hands all of them the same environment)."""
    if not local_ranks:
        raise ContractError("a node's launch needs at least one local rank")
    per_rank = [render_rank(r) for r in local_ranks]
    env = {}
    for name in NAMES:
        values = [r[name] for r in per_rank]
        env[name] = values[0] if len(set(values)) == 1 else ",".join(values)
    return env


def command_placeholders(local_ranks: Sequence[RankContract]) -> dict[str, str]:
    """``{stage_layers}`` and ``{local_micro_batch}`` for a node's command line.

    A command is one per node, so a placeholder exists only when the node's ranks agree on it; a
    node with two stages cannot put ``{stage_layers}`` in one command line and must read
    ``FRENZY_STAGE_LAYERS`` instead."""
    env = render(local_ranks)
    out = {}
    for key, name in (("stage_layers", STAGE_LAYERS), ("local_micro_batch", LOCAL_MICRO_BATCH)):
        if "," in env[name]:
            raise ContractError(f"{{{key}}} differs between this node's local ranks ({env[name]}): "
                                f"the script must read {name} per rank")  # fmt: skip
        out[key] = env[name]
    return out


def parse(env: Mapping[str, str]) -> RankContract | None:
    """This rank's contract from an environment, or None when none of the five is set.

    Raises ContractError, naming the variable and its value, when only some are set or a value is
    malformed."""
    present = [name for name in NAMES if name in env]
    if not present:
        return None
    missing = [name for name in NAMES if name not in env]
    if missing:
        raise ContractError(f"{', '.join(present)} set but not {', '.join(missing)}: a mixed plan's launch "
                            f"sets all of {', '.join(NAMES)}, a homogeneous one none")  # fmt: skip
    values = {name: _pick(name, env[name], env) for name in NAMES}
    first, last = _layers(values[STAGE_LAYERS])
    try:
        return RankContract(
            stage=_integer(STAGE, values[STAGE], 0),
            first_layer=first,
            last_layer=last,
            local_micro_batch=_integer(LOCAL_MICRO_BATCH, values[LOCAL_MICRO_BATCH], 1),
            local_grad_accum=_integer(LOCAL_GRAD_ACCUM, values[LOCAL_GRAD_ACCUM], 1),
            loss_scale=_share(values[LOSS_SCALE]),
        )
    except ContractError as err:
        raise ContractError(f"{err} (this rank's values: {values})") from None


def _pick(name: str, text: str, env: Mapping[str, str]) -> str:
    """One value, or this local rank's entry of a per-local-rank list."""
    items = [item.strip() for item in text.split(",")]
    if len(items) == 1:
        return items[0]
    where = f"{name}={text!r} is a list of {len(items)} values, one per local rank"
    rank_text = env.get(LOCAL_RANK)
    if rank_text is None:
        raise ContractError(f"{where}, but {LOCAL_RANK} is not set (launch the script with torchrun)")
    rank = _integer(LOCAL_RANK, rank_text.strip(), 0)
    size_text = env.get(LOCAL_WORLD_SIZE)
    if size_text is not None and _integer(LOCAL_WORLD_SIZE, size_text.strip(), 1) != len(items):
        raise ContractError(f"{where}, but this node runs {size_text.strip()} ({LOCAL_WORLD_SIZE})")
    if rank >= len(items):
        raise ContractError(f"{where}, but {LOCAL_RANK} is {rank}")
    return items[rank]


def _integer(name: str, text: str, low: int) -> int:
    # int() alone would take "+3", " 3", "3_000" and "٣"; the contract is plain ASCII digits.
    if not (text.isascii() and text.isdigit()) or int(text) < low:
        raise ContractError(f"{name}={text!r}: expected an integer >= {low}")
    return int(text)


def _layers(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    if not sep:
        raise ContractError(f"{STAGE_LAYERS}={text!r}: expected FIRST-LAST, the stage's first and last block (0-2)")
    a, b = _integer(STAGE_LAYERS, first.strip(), 0), _integer(STAGE_LAYERS, last.strip(), 0)
    if b < a:
        raise ContractError(f"{STAGE_LAYERS}={text!r}: the last block comes before the first")
    return a, b


def _share(text: str) -> Fraction:
    try:
        value = Fraction(text)  # "3/8", "0.375", "1"
    except (ValueError, ZeroDivisionError):
        raise ContractError(f"{LOSS_SCALE}={text!r}: expected a fraction b/B such as 3/8") from None
    if not 0 < value <= 1:
        raise ContractError(f"{LOSS_SCALE}={text!r}: a share of the global batch lies in (0, 1]")
    return value


def _fraction_text(value: Fraction) -> str:
    return str(value)  # "3/8", or "1" for a whole share: exact, and what Fraction() reads back
