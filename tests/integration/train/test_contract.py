"""The launch contract of a mixed plan and the training helper's pure side (frenzy.train), without torch.

Parsing and rendering the five variables (one value per node or one per local rank), the errors a
malformed launch gets, the loss factor's maths checked exactly against the global-batch mean, the
homogeneous case (plain ``loss / grad_accum`` and DDP's ``no_sync`` schedule) and that the package
imports without torch or the server side. The torchrun proofs are in test_mixed_training.py.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
from fractions import Fraction

import pytest

from frenzy.train import ContractError, RankContract, loss_shares, mixed_share, parse, render
from frenzy.train.contract import NAMES, command_placeholders, render_rank

A = RankContract(stage=0, first_layer=0, last_layer=1, local_micro_batch=3, local_grad_accum=2, loss_scale=Fraction(3, 8))
B = RankContract(stage=0, first_layer=0, last_layer=1, local_micro_batch=2, local_grad_accum=1, loss_scale=Fraction(1, 8))
S0 = RankContract(stage=0, first_layer=0, last_layer=2, local_micro_batch=2, local_grad_accum=4, loss_scale=Fraction(1))
S1 = RankContract(stage=1, first_layer=3, last_layer=3, local_micro_batch=2, local_grad_accum=4, loss_scale=Fraction(1))


def test_one_value_per_node_round_trips() -> None:
    env = render([A, A])
    assert env == {"FRENZY_STAGE": "0", "FRENZY_STAGE_LAYERS": "0-1", "FRENZY_LOCAL_MICRO_BATCH": "3",
                   "FRENZY_LOCAL_GRAD_ACCUM": "2", "FRENZY_LOSS_SCALE": "3/8"}  # fmt: skip
    assert parse(env) == A
    assert A.local_batch == 6 and A.global_batch == 16 and A.layers == range(0, 2)
    assert command_placeholders([A, A]) == {"stage_layers": "0-1", "local_micro_batch": "3"}


def test_per_local_rank_lists_pick_by_local_rank() -> None:
    env = render([S0, S0, S1, S1])
    assert env["FRENZY_STAGE"] == "0,0,1,1" and env["FRENZY_STAGE_LAYERS"] == "0-2,0-2,3-3,3-3"
    assert env["FRENZY_LOCAL_MICRO_BATCH"] == "2" and env["FRENZY_LOSS_SCALE"] == "1"
    for rank, expected in enumerate([S0, S0, S1, S1]):
        assert parse({**env, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "4"}) == expected
    with pytest.raises(ContractError, match="stage_layers.*differs"):
        command_placeholders([S0, S1])


def test_absent_is_homogeneous_and_partial_is_an_error() -> None:
    assert parse({}) is None
    assert parse({"PATH": "/bin", "FRENZY_CHECKPOINT_DIR": "/x"}) is None  # other FRENZY_ names are not the contract
    with pytest.raises(ContractError, match="FRENZY_LOSS_SCALE set but not FRENZY_STAGE, "):
        parse({"FRENZY_LOSS_SCALE": "3/8"})


@pytest.mark.parametrize(("name", "value", "message"), [
    ("FRENZY_STAGE", "-1", "FRENZY_STAGE='-1': expected an integer >= 0"),
    ("FRENZY_STAGE", "one", "FRENZY_STAGE='one'"),
    ("FRENZY_LOCAL_MICRO_BATCH", "0", "FRENZY_LOCAL_MICRO_BATCH='0': expected an integer >= 1"),
    ("FRENZY_LOCAL_MICRO_BATCH", "+3", "FRENZY_LOCAL_MICRO_BATCH='\\+3'"),
    ("FRENZY_LOCAL_GRAD_ACCUM", "2.0", "FRENZY_LOCAL_GRAD_ACCUM='2.0'"),
    ("FRENZY_STAGE_LAYERS", "3", "expected FIRST-LAST"),
    ("FRENZY_STAGE_LAYERS", "3-1", "the last block comes before the first"),
    ("FRENZY_LOSS_SCALE", "0", "a share of the global batch lies in"),
    ("FRENZY_LOSS_SCALE", "3/2", "a share of the global batch lies in"),
    ("FRENZY_LOSS_SCALE", "1/0", "expected a fraction"),
    ("FRENZY_LOSS_SCALE", "0.33", "implies a global batch of 18.1818"),  # a rounded 6/18
    ("FRENZY_LOSS_SCALE", "3/8,1/8", "LOCAL_RANK is not set"),
])  # fmt: skip
def test_malformed_values_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        parse({**render([A]), name: value})


def test_exact_decimals_are_accepted_and_lists_checked_against_the_node() -> None:
    assert parse({**render([A]), "FRENZY_LOSS_SCALE": "0.375"}) == A
    env = {**render([S0, S1]), "LOCAL_RANK": "1"}
    with pytest.raises(ContractError, match="this node runs 4"):
        parse({**env, "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(ContractError, match="LOCAL_RANK is 2"):
        parse({**env, "LOCAL_RANK": "2"})


def test_loss_shares_are_exact() -> None:
    assert loss_shares([6, 6, 2, 2]) == (Fraction(3, 8), Fraction(3, 8), Fraction(1, 8), Fraction(1, 8))
    assert sum(loss_shares([5, 7, 11])) == 1
    with pytest.raises(ContractError):
        loss_shares([4, 0])


def _ddp_gradient(ranks: list[tuple[int, int]], grads: list[Fraction]) -> Fraction:
    """What a mean all-reduce ends with when every rank back-propagates share.scale(micro-batch
    mean) over its micro-steps, with scalar per-sample "gradients", exactly: the factor is the
    helper's, read back from the rendered environment as a rank would."""
    shares = loss_shares([m * a for m, a in ranks])
    total, start = Fraction(0), 0
    for (m, a), share in zip(ranks, shares, strict=True):
        env = render_rank(RankContract(0, 0, 0, m, a, share))
        helper = mixed_share(env={**env, "WORLD_SIZE": str(len(ranks))})
        assert (helper.micro_batch, helper.grad_accum, helper.global_batch) == (m, a, len(grads))
        factor = len(ranks) * parse(env).loss_scale / a  # type: ignore[union-attr]
        assert helper.loss_factor == pytest.approx(float(factor), rel=1e-15)
        for k in range(a):
            micro = grads[start + k * m : start + (k + 1) * m]
            total += factor * sum(micro) / m
        start += m * a
    return total / len(ranks)  # DDP's all-reduce: sum, then divide by W


def test_the_loss_factor_gives_the_global_batch_mean_gradient() -> None:
    rng = random.Random(33)
    for ranks in ([(3, 2), (3, 2), (2, 1), (2, 1)], [(4, 1)] * 4, [(5, 3), (1, 1), (2, 7)]):
        grads = [Fraction(rng.randint(-1000, 1000), 97) for _ in range(sum(m * a for m, a in ranks))]
        assert _ddp_gradient(ranks, grads) == sum(grads) / len(grads)
    # Without the shares (every rank weighted 1/W) the uneven split is wrong: the check can tell.
    grads = [Fraction(s) for s in range(16)]
    naive = sum(sum(grads[lo:hi]) / (hi - lo) for lo, hi in ((0, 6), (6, 12), (12, 14), (14, 16))) / 4
    assert naive != sum(grads) / 16


class _DDPLike:
    def __init__(self) -> None:
        self.entered: list[bool] = []

    @contextlib.contextmanager
    def no_sync(self):  # type: ignore[no-untyped-def]
        self.entered.append(True)
        yield


class _FSDP2Like:
    def __init__(self) -> None:
        self.flags: list[bool] = []

    def set_requires_gradient_sync(self, enabled: bool) -> None:
        self.flags.append(enabled)


def test_homogeneous_is_plain_training() -> None:
    share = mixed_share(micro_batch=8, grad_accum=4, env={"WORLD_SIZE": "8"})
    assert not share.mixed and share.contract is None
    assert share.loss_factor == 0.25 and share.scale(2.0) == 0.5  # loss / grad_accum
    assert (share.micro_batch, share.global_batch, share.blocks(6)) == (8, 256, range(6))
    ddp = _DDPLike()
    for k in range(4):
        with share.sync(ddp, k):
            pass
    assert ddp.entered == [True, True, True]  # no_sync on micro-steps 0..2, the last one syncs
    assert mixed_share(env={}).loss_factor == 1.0 and mixed_share(env={}).dp_size == 1


def test_sync_schedule_follows_the_contract_not_the_recipe() -> None:
    share = mixed_share(micro_batch=8, grad_accum=4, env={**render([A]), "WORLD_SIZE": "4"})
    assert share.mixed and (share.micro_batch, share.grad_accum, share.loss_factor) == (3, 2, 0.75)
    assert [share.is_sync_step(k) for k in range(2)] == [False, True]
    fsdp = _FSDP2Like()
    for k in range(2):
        with share.sync(fsdp, k):
            pass
    assert fsdp.flags == [False, True, True, True]  # off for micro-step 0, on for the last, left on
    with share.sync(object(), 0):  # one process: nothing to skip
        pass
    with pytest.raises(ContractError, match="micro_step must be in 0..1"):
        share.is_sync_step(2)


def test_blocks_and_world_size_errors() -> None:
    share = mixed_share(dp_size=1, env={**render([S0, S1]), "LOCAL_RANK": "1"})
    assert share.blocks(4) == range(3, 4)
    with pytest.raises(ContractError, match="the model has 3 blocks"):
        share.blocks(3)
    with pytest.raises(ContractError, match="WORLD_SIZE='x'"):
        mixed_share(env={"WORLD_SIZE": "x"})
    with pytest.raises(ContractError, match="dp_size"):
        mixed_share(dp_size=0, env={})


def test_every_name_is_a_reserved_frenzy_variable() -> None:
    # A job's own env may not set FRENZY_* (frenzy.agent.jobenv), so a user cannot forge a share.
    assert all(name.startswith("FRENZY_") for name in NAMES) and len(set(NAMES)) == 5


def test_the_package_imports_without_torch_or_the_server_side() -> None:
    code = ("import sys\nsys.modules['torch'] = None\nimport frenzy.train\n"
            "heavy = [m for m in ('torch', 'redis', 'grpc', 'numpy', 'frenzy.state', 'frenzy.rpc') if sys.modules.get(m)]\n"
            "assert not heavy, heavy\nprint(frenzy.train.mixed_share(env={}).loss_factor)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "1.0", done.stderr
