"""Proof on CPU that a mixed plan trains exactly as the homogeneous recipe: real torchrun, gloo, loopback.

* Uneven data parallelism: two torchrun "nodes" of two processes each pose as two GPU types, the
  launcher's contract (``frenzy.train.contract.render``) in each node's environment: type A takes
  local batch 6 (micro-batch 3 x 2 accumulation steps), type B local batch 2 (2 x 1), global batch
  16. After 5 SGD steps every rank's parameters equal a single-process run on the same global
  batches within 1e-5 relative (float64: they agree to ~1e-15), and so does the logged loss. The
  same worker without the contract (4 ranks x 4, the homogeneous recipe) gives the same result.
* Uneven pipeline stages: ``torch.distributed.pipelining`` over 2 processes, stages of 3 and 1
  blocks of a 4-block model read from ``FRENZY_STAGE_LAYERS`` (one node: per-local-rank lists),
  GPipe over 4 micro-batches of 2: the loss and every gradient equal the unsplit model's.

The workers (dp_worker.py, pp_worker.py) use ``frenzy.train`` as a user's script would. Each test
also shows the tolerance has teeth: the naive run (plain DDP averaging of unequal batches, or a
pipeline without the share) misses the reference by orders of magnitude more than it allows.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch", reason="the mixed-plan training tests need torch (pip install -e '.[train]')")

from frenzy.train.contract import RankContract, loss_shares, render  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
RTOL = 1e-5
LAUNCH_TIMEOUT_S = 150


def _tiny_gpt() -> ModuleType:
    # This directory is no package (the workers import tiny_gpt from their own directory): by path.
    spec = importlib.util.spec_from_file_location("frenzy_test_tiny_gpt", HERE / "tiny_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny_gpt = _tiny_gpt()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _base_env() -> dict[str, str]:
    """This process's environment without anything that would steer torchrun or the contract."""
    drop = ("FRENZY_", "PET_", "TORCHELASTIC_")
    own = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k not in own}
    env["OMP_NUM_THREADS"] = "1"  # 4 workers on 2 cores: no thread pools fighting over them
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only, whatever the host name resolves to
    return env


def _torchrun(script: str, nodes: list[tuple[int, dict[str, str]]], args: list[str]) -> None:
    """One torchrun per node (``nproc`` workers, its contract in the environment), static rendezvous
    on 127.0.0.1; fails the test with every node's output unless all exit 0. A port taken between
    choosing and binding it is retried on another."""
    for attempt in range(3):
        port = _free_port()
        procs = []
        for node_rank, (nproc, contract) in enumerate(nodes):
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(nodes)}", f"--node-rank={node_rank}",
                   f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}",
                   "--max-restarts=0", str(HERE / script), *args]  # fmt: skip
            procs.append(subprocess.Popen(cmd, env={**_base_env(), **contract}, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))  # fmt: skip
        outputs, deadline = [], time.monotonic() + LAUNCH_TIMEOUT_S
        for proc in procs:
            try:
                outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                _stop(procs)
                outputs.append(proc.communicate()[0])
        text = "\n".join(f"--- node {i} (rc {p.returncode}) ---\n{out[-6000:]}" for i, (p, out) in
                         enumerate(zip(procs, outputs, strict=True)))  # fmt: skip
        if all(p.returncode == 0 for p in procs):
            return
        if "address already in use" not in text.lower() or attempt == 2:
            pytest.fail(f"torchrun {script} failed:\n{text}")


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, recursively, from /proc (Linux; empty elsewhere)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = [int(k) for k in children.read_text().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *_descendants(kid)]
    return found


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    """End the torchrun agents this test started and their workers. The workers run in sessions of
    their own (torchrun starts them so), so killing an agent's process group would leave them
    behind holding its output pipe: ask each agent to stop its workers (SIGTERM), then kill
    whatever of ours is left, by pid."""
    ours = [pid for p in procs if p.poll() is None for pid in (p.pid, *_descendants(p.pid))]
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 15
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for _, p in sorted(params.items())])


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The worst per-tensor relative difference, ||a - b|| / ||b|| (max over tensors, over their
    elements' scale: a bias that starts at zero is measured against the tensor's own size)."""
    assert sorted(a) == sorted(b)
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(1e-12)) for n in b)


# --- uneven data parallelism -------------------------------------------------------------------

N_LAYERS_DP, STEPS_DP, GLOBAL = 2, 5, 16
TYPE_A = (3, 2)  # micro-batch, accumulation steps: local batch 6 on each of 2 ranks
TYPE_B = (2, 1)  # local batch 2 on each of 2 ranks


def _single_process(steps: int, n_layers: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The homogeneous recipe on one process: each step one global batch of 16, mean loss."""
    model = tiny_gpt.build(n_layers)
    opt = tiny_gpt.optimizer(model.parameters())
    losses = []
    for step in range(steps):
        x, y = tiny_gpt.global_batch(step, GLOBAL)
        loss = tiny_gpt.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


def _naive_uneven(steps: int, n_layers: int) -> dict[str, torch.Tensor]:
    """What plain DDP does with the same uneven batches and no shares: the average of the ranks'
    mean gradients (loss / grad_accum on each rank, mean all-reduce), computed in one process."""
    model = tiny_gpt.build(n_layers)
    opt = tiny_gpt.optimizer(model.parameters())
    ranks = [TYPE_A, TYPE_A, TYPE_B, TYPE_B]
    for step in range(steps):
        x, y = tiny_gpt.global_batch(step, GLOBAL)
        start = 0
        for m, a in ranks:
            for k in range(a):
                rows = slice(start + k * m, start + (k + 1) * m)
                (tiny_gpt.loss_fn(model(x[rows]), y[rows]) / a / len(ranks)).backward()
            start += m * a
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _uneven_nodes() -> list[tuple[int, dict[str, str]]]:
    """The launcher's side: two nodes of two ranks, one per GPU type, shares rendered by the contract."""
    (m_a, a_a), (m_b, a_b) = TYPE_A, TYPE_B
    shares = loss_shares([m_a * a_a] * 2 + [m_b * a_b] * 2)
    assert shares == (Fraction(3, 8),) * 2 + (Fraction(1, 8),) * 2
    last = N_LAYERS_DP - 1
    node_a = [RankContract(0, 0, last, m_a, a_a, shares[0])] * 2
    node_b = [RankContract(0, 0, last, m_b, a_b, shares[2])] * 2
    return [(2, render(node_a)), (2, render(node_b))]


@pytest.mark.parametrize("plan", ["mixed", "homogeneous"])
def test_uneven_data_parallel_equals_one_process(plan: str, tmp_path: Path) -> None:
    if plan == "mixed":
        nodes = _uneven_nodes()
        assert nodes[0][1]["FRENZY_LOSS_SCALE"] == "3/8" and nodes[1][1]["FRENZY_LOCAL_MICRO_BATCH"] == "2"
        expected = {0: (0, 6), 1: (6, 12), 2: (12, 14), 3: (14, 16)}
    else:  # no contract: the worker's recipe values (micro-batch 4, no accumulation) on 4 ranks
        nodes = [(4, {})]
        expected = {r: (4 * r, 4 * r + 4) for r in range(4)}
    _torchrun("dp_worker.py", nodes, [str(tmp_path), str(STEPS_DP), str(N_LAYERS_DP)])

    reference, ref_losses = _single_process(STEPS_DP, N_LAYERS_DP)
    initial = {n: p.detach() for n, p in tiny_gpt.build(N_LAYERS_DP).named_parameters()}
    moved = float((_flat(reference) - _flat(initial)).norm() / _flat(initial).norm())
    assert moved > 1e-3, f"the reference barely trained ({moved:.2e}): the comparison would prove nothing"
    for rank, rows in expected.items():
        out = torch.load(tmp_path / f"rank{rank}.pt")
        assert out["rows"] == rows, (rank, out["rows"])
        worst = _rel(out["params"], reference)
        assert worst <= RTOL, f"rank {rank}: parameters differ from one process by {worst:.3e} relative"
        assert out["losses"] == pytest.approx(ref_losses, rel=RTOL), (rank, out["losses"], ref_losses)

    if plan == "mixed":  # the check has teeth: unscaled uneven DDP is far outside the tolerance
        naive = _rel(_naive_uneven(STEPS_DP, N_LAYERS_DP), reference)
        assert naive > 1000 * RTOL, f"naive uneven DDP within {naive:.2e}: the test could not tell"


# --- uneven pipeline stages ------------------------------------------------------------------------

N_LAYERS_PP, STEPS_PP, MICRO_PP, ACCUM_PP = 4, 2, 2, 4


def _unsplit(steps: int, share_scaled: bool = True) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The whole model on one process, one batch of 8 a step: the last step's gradients and each
    step's loss. ``share_scaled=False`` sums the micro-batch means instead (a pipeline whose loss
    is not scaled), for the test's own sensitivity check."""
    model = tiny_gpt.build(N_LAYERS_PP)
    opt = tiny_gpt.optimizer(model.parameters())
    losses, grads = [], {}
    for step in range(steps):
        x, y = tiny_gpt.global_batch(step, MICRO_PP * ACCUM_PP)
        if share_scaled:
            loss = tiny_gpt.loss_fn(model(x), y)
        else:
            loss = sum(tiny_gpt.loss_fn(model(xm), ym) for xm, ym in
                       zip(x.split(MICRO_PP), y.split(MICRO_PP), strict=True))  # fmt: skip
        loss.backward()
        losses.append(float(loss.detach()))
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return grads, losses


def test_uneven_pipeline_stages_equal_the_unsplit_model(tmp_path: Path) -> None:
    stages = [RankContract(0, 0, 2, MICRO_PP, ACCUM_PP, Fraction(1)), RankContract(1, 3, 3, MICRO_PP, ACCUM_PP, Fraction(1))]
    contract = render(stages)  # both stages on one node: per-local-rank lists
    assert contract["FRENZY_STAGE_LAYERS"] == "0-2,3-3" and contract["FRENZY_STAGE"] == "0,1"
    _torchrun("pp_worker.py", [(2, contract)], [str(tmp_path), str(STEPS_PP), str(N_LAYERS_PP)])

    first, last = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert (first["blocks"], last["blocks"]) == ((0, 3), (3, 4))
    assert not set(first["grads"]) & set(last["grads"]), "a parameter on both stages"
    assert any(n.startswith("tok.") for n in first["grads"]) and any(n.startswith("head.") for n in last["grads"])
    grads, losses = _unsplit(STEPS_PP)
    split = {**first["grads"], **last["grads"]}
    worst = _rel(split, grads)  # also checks that the two stages hold every parameter, once
    assert worst <= 1e-9, f"stage gradients differ from the unsplit model's by {worst:.3e} relative"
    assert last["losses"] == pytest.approx(losses, rel=1e-12, abs=0), (last["losses"], losses)

    unscaled, _ = _unsplit(STEPS_PP, share_scaled=False)
    assert _rel(unscaled, grads) > 1.0, "a pipeline without the share would pass: the test could not tell"
