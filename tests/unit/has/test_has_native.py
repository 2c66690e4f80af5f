"""The two builds of HAS's scheduling pass: mypyc-compiled (setup.py) and plain source.

The compiled build is the same source run faster; these tests hold it to that: the two
decide identically on random states (preemption included), the import guard never lets a
compiled module built from an older source shadow an edit, and ``FRENZY_PURE_PYTHON=1``
really runs the source. The other HAS tests run against whichever build is installed (the
compiled one on a machine with a C compiler), so they cover it as well.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import random
from pathlib import Path

import pytest
from unit.has.test_has_equivalence import POLICIES, _completion, plain, random_cluster, random_queue

import has
from has import QueuedJob, QueuePolicy, RunningJob, schedule
from has._native import NATIVE_MODULES, RECORD, compiled_is_current, load_sources
from support.python_proc import run_python

PACKAGE = Path(has.__file__).resolve().parent
SRC = load_sources("has_source_build")


def _source_inputs(queue: list[QueuedJob], policy: QueuePolicy) -> tuple[list, object]:
    """The same queue and policy as objects of the source build's own classes."""
    placement, queued, policy_mod = SRC["placement"], SRC["queued"], SRC["policy"]
    memo: dict[int, tuple] = {}
    out = []
    for j in queue:
        plans = memo.setdefault(id(j.plans), tuple(
            placement.PlanOption(p.gpu_type, p.tp, p.pp, p.dp, p.bytes_per_gpu, p.label, p.runtime_s)
            for p in j.plans
        ))  # fmt: skip
        out.append(queued.QueuedJob(j.job_id, j.seq, j.submitted_at, plans))
    knobs = {f: getattr(policy, f) for f in policy.__dataclass_fields__}
    return out, policy_mod.QueuePolicy(**knobs)


def _running(rng: random.Random, cluster: has.ClusterView, now: float) -> list[RunningJob]:
    """Every job that owns GPUs, some started seconds ago (so preemption is weighed)."""
    owners = sorted(cluster.gpus_by_owner())
    return [
        RunningJob(o, started_at=now - rng.choice([5.0, 30.0, 500.0]), submitted_at=now - rng.choice([5.0, 40.0]))
        for o in owners
    ]


def _plain(res: object) -> tuple:
    preemptions = [(p.job_id, p.for_job, p.lost_s) for p in res.preemptions]  # type: ignore[attr-defined]
    return plain(res), preemptions  # type: ignore[arg-type]


@pytest.mark.parametrize("block", range(3))
def test_installed_and_source_builds_decide_the_same(block: int) -> None:
    """Random states under every policy knob, with running jobs for preemption: the installed
    build (compiled where the machine could compile it) and the source give equal results."""
    placed = preempted = 0
    for seed in range(block * 60, (block + 1) * 60):
        rng = random.Random(seed)
        now = rng.uniform(0, 1e5)
        cluster = random_cluster(rng, now)
        queue = random_queue(rng, now)
        running = _running(rng, cluster, now)
        src_running = [SRC["policy"].RunningJob(r.job_id, r.started_at, r.submitted_at) for r in running]
        # (and the preempting policy every time: preemption is rare in random states, and which
        # three policies a seed samples changes whenever POLICIES does)
        for policy in [*rng.sample(POLICIES, 3), _completion()]:
            src_queue, src_policy = _source_inputs(queue, policy)
            src_cluster = SRC["cluster"].ClusterView(cluster.nodes)  # the source's own view
            try:
                want = _plain(SRC["queue_pass"].schedule(src_cluster, src_queue, now, src_policy, src_running))
            except ValueError as exc:
                want = ("error", str(exc))
            try:
                got = _plain(schedule(cluster, queue, now, policy, running))
            except ValueError as exc:
                got = ("error", str(exc))
            assert got == want, f"seed {seed}, {policy}"
            if want[0] != "error":
                placed += len(want[0][0])
                preempted += len(want[1])
    assert placed > 50 and preempted > 0  # the states exercise placement and preemption


def _fake_build(tmp_path: Path, sources: dict[str, bytes], compiled: set[str], record: dict | None) -> Path:
    tmp_path.mkdir(parents=True)
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_bytes(text)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in compiled:
        (tmp_path / f"{name}{suffix}").write_bytes(b"")
    if record is not None:
        (tmp_path / RECORD).write_text(json.dumps(record))
    return tmp_path


def test_the_guard_accepts_only_a_build_of_the_sources_here(tmp_path: Path) -> None:
    sources = {name: f"# {name}\n".encode() for name in NATIVE_MODULES}
    record = {"sources": {f"has.{n}": hashlib.sha256(t).hexdigest() for n, t in sources.items()}}
    every = set(NATIVE_MODULES)
    assert compiled_is_current(_fake_build(tmp_path / "ok", sources, every, record))
    # an edited source: its compiled module is stale, so none is used
    edited = dict(sources, policy=b"# policy, edited\n")
    assert not compiled_is_current(_fake_build(tmp_path / "edited", edited, every, record))
    # a module the build did not compile, no record, a broken record
    assert not compiled_is_current(_fake_build(tmp_path / "missing", sources, every - {"policy"}, record))
    assert not compiled_is_current(_fake_build(tmp_path / "norecord", sources, every, None))
    broken = _fake_build(tmp_path / "broken", sources, every, None)
    (broken / RECORD).write_text("{not json")
    assert not compiled_is_current(broken)


def _import_in_subprocess(env_extra: dict[str, str]) -> dict:
    code = (
        "import importlib, json, has\n"
        "from has._native import NATIVE_MODULES\n"
        "files = [importlib.import_module('has.' + m).__file__ for m in NATIVE_MODULES]\n"
        "print(json.dumps({'native': has.NATIVE, 'files': files}))\n"
    )
    return json.loads(run_python(code, env_extra, unset="FRENZY_PURE_PYTHON"))


def test_pure_python_switch_runs_the_sources() -> None:
    got = _import_in_subprocess({"FRENZY_PURE_PYTHON": "1"})
    assert got["native"] is False
    assert all(f.endswith(".py") for f in got["files"]), got["files"]


def test_a_current_compiled_build_is_used() -> None:
    """Where the install compiled the modules (its record is there and matches the sources),
    a fresh interpreter runs the compiled build; where it could not, there is nothing to use."""
    if not compiled_is_current(PACKAGE):
        pytest.skip("no current compiled build here (no C compiler at install, or sources edited since)")
    got = _import_in_subprocess({})
    assert got["native"] is True
    assert not any(f.endswith(".py") for f in got["files"]), got["files"]


def test_the_compiled_modules_pass_the_type_check_mypyc_runs() -> None:
    """mypyc type-checks the modules before compiling them, and setup.py falls back to pure
    Python when that fails (so an install never breaks). The price: a type error would make
    every install silently ~3x slower, and ``test_a_current_compiled_build_is_used`` would
    only skip. Running the same checker (mypy, pinned like the build's) catches it here."""
    mypy_api = pytest.importorskip("mypy.api")
    files = [str(PACKAGE / f"{name}.py") for name in NATIVE_MODULES]
    out, err, status = mypy_api.run(["--no-incremental", *files])
    assert status == 0, (
        f"mypy (the check mypyc runs at install) fails, so the install runs pure Python:\n{out}{err}"
        "To fix: correct the errors above, then `make .venv/.installed` compiles the modules again."
    )
