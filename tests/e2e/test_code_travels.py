"""Code that travels (issue 20), end to end: a local stack (scheduler, predictor, fake-GPU agents
as separate processes, each on its own Redis user), and projects in fresh directories the agents
have never seen. `frenzy submit --wait -- python train.py` and the SDK (sync, asyncio, and the
runnable example) run that directory's train.py; the same tree is stored once; the size limit
stops a submission before anything is sent; an archive that climbs out or links out is refused
by the agent and the job fails saying why."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from frenzy import AsyncClient, Client
from frenzy.devstack.stack import LocalStack
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2
from has.cluster_spec import parse_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FRENZY = str(Path(sys.executable).with_name("frenzy"))
CLUSTER = {"nodes": [{"gpu": "A100-80GB", "count": 2, "gpus_per_node": 2, "name_prefix": "a100"}]}
TRAIN = """import os, pathlib
data = pathlib.Path("data/words.txt").read_text().strip()
print("TRAINED on", data, "in", os.path.basename(os.getcwd()), "rank", os.environ["FRENZY_NODE_RANK"])
"""


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = LocalStack.create(parse_cluster(CLUSTER), run_dir=str(tmp_path_factory.mktemp("run")), redis_url=redis_url,
                          prefix=f"t{uuid.uuid4().hex[:10]}", with_worker=False, heartbeat_s=0.5, ttl_s=3)
    s.start()
    yield s
    s.stop()


@pytest.fixture
def env(stack: LocalStack) -> dict[str, str]:
    return {**os.environ, "FRENZY_SCHEDULER": stack.scheduler_addr, "FRENZY_TOKEN": stack.token,
            "FRENZY_EXAMPLE_PYTHON": sys.executable}


@pytest.fixture
def client(stack: LocalStack) -> Iterator[Client]:
    with Client(stack.scheduler_addr, stack.token) as c:
        yield c


def _project(root: Path, words: str) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "data" / "words.txt").write_text(words + "\n")
    return root


def _code_keys(stack: LocalStack) -> list[str]:
    with redis.Redis.from_url(stack.redis_url, decode_responses=True) as r:
        return sorted(r.scan_iter(f"{Keys(stack.prefix).prefix}:code:*"))


def test_frenzy_submit_wait_runs_the_directory_s_train_py(stack: LocalStack, env: dict[str, str], client: Client,
                                                         tmp_path: Path) -> None:
    proj = _project(tmp_path / "fresh-project", "tokens-from-the-cli")
    cmd = [FRENZY, "submit", "--model", "gpt2-355m", "--seq-len", "1024", "--global-batch", "32", "--wait",
           "--", sys.executable, "train.py"]
    first = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "uploaded" in first.stdout and "SUCCEEDED" in first.stdout, first.stdout
    job = client.jobs(limit=1)[0]
    assert job.state == "SUCCEEDED" and job.code_sha256
    out = "\n".join(client.logs(job.id))
    assert "TRAINED on tokens-from-the-cli" in out, out
    # The same tree again: not sent again, and one copy in Redis.
    again = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already stored" in again.stdout, again.stdout + again.stderr
    assert _code_keys(stack) == [f"{stack.prefix}:code:{job.code_sha256}"]


def test_the_sdk_runs_a_fresh_directory_s_train_py(stack: LocalStack, client: Client, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path / "sdk-project", "tokens-from-the-sdk")
    monkeypatch.chdir(proj)
    # The issue's words: `python` as the nodes' PATH finds it (this interpreter where there is none).
    python = "python" if shutil.which("python") else sys.executable
    job = client.submit(model="gpt2-355m", seq_len=1024, global_batch=32, command=[python, "train.py"])
    assert job.state == "PENDING" and job.code_sha256
    done = job.wait(timeout=90)
    assert done.succeeded, done
    last = done.attempts[-1]
    assert last.gpu_type == done.plan.gpu_type and last.layout == done.plan.layout and last.exit_code == 0, last
    assert any("TRAINED on tokens-from-the-sdk" in line for line in client.logs(done.id))


def test_the_async_client_does_the_same(stack: LocalStack, tmp_path: Path) -> None:
    proj = _project(tmp_path / "async-project", "tokens-from-asyncio")

    async def run() -> tuple[str, list[str]]:
        async with AsyncClient(stack.scheduler_addr, stack.token) as ac:
            job = await ac.submit(model="gpt2-355m", seq_len=1024, global_batch=32,
                                  command=[sys.executable, "train.py"], code_dir=proj)
            done = await ac.wait(job.id, timeout=90)
            return done.state, [line async for line in ac.logs(job.id)]

    state, lines = asyncio.run(run())
    assert state == "SUCCEEDED" and any("TRAINED on tokens-from-asyncio" in line for line in lines), lines


def test_the_sdk_example_runs(stack: LocalStack, env: dict[str, str], tmp_path: Path) -> None:
    proj = _project(tmp_path / "example-project", "tokens-from-the-example")
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "sdk_submit.py"), "train.py"], cwd=proj, env=env,
                         capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "best plan:" in res.stdout and "TRAINED on tokens-from-the-example" in res.stdout
    assert res.stdout.rstrip().endswith("SUCCEEDED")


def test_too_much_code_is_refused_before_anything_is_sent(stack: LocalStack, env: dict[str, str],
                                                         tmp_path: Path) -> None:
    proj = _project(tmp_path / "heavy", "x")
    (proj / "checkpoint.pt").write_bytes(os.urandom(200_000))
    before = _code_keys(stack)
    res = subprocess.run([FRENZY, "submit", "--model", "gpt2-355m", "--seq-len", "1024", "--global-batch", "32",
                          "--max-code-mib", "0.1", "--", "python", "train.py"], cwd=proj, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    said = " ".join(res.stderr.split())  # rich wraps long lines
    assert "checkpoint.pt (0.2 MiB)" in said and "--max-code-mib" in said, said
    assert _code_keys(stack) == before


def _evil(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        body = b"print('should never run')\n"
        ok = tarfile.TarInfo("train.py")
        ok.size = len(body)
        tar.addfile(ok, io.BytesIO(body))
        if kind == "traversal":
            bad = tarfile.TarInfo("../../escaped.txt")
            bad.size = 4
            tar.addfile(bad, io.BytesIO(b"evil"))
        else:
            link = tarfile.TarInfo("etc")
            link.type = tarfile.SYMTYPE
            link.linkname = "/etc"
            tar.addfile(link)
    return buf.getvalue()


@pytest.mark.parametrize(("kind", "why"), [("traversal", "'..' component"), ("symlink", "absolute target")])
def test_an_archive_that_reaches_out_is_refused_by_the_agent(stack: LocalStack, client: Client, kind: str,
                                                             why: str) -> None:
    blob = _evil(kind)
    sha = hashlib.sha256(blob).hexdigest()
    # Uploaded by hand (the CLI never packs such a thing): the scheduler stores any bytes that
    # match their sha256; it is the agent that must refuse to unpack them.
    ref = client._stub.UploadCode(iter([scheduler_pb2.CodeChunk(sha256=sha, size=len(blob), data=blob)]),
                                  timeout=10)
    assert ref.sha256 == sha
    from frenzy.rpc.jobspec import parse_entry

    spec = parse_entry({"model": "gpt2-355m", "seq_len": 1024, "global_batch": 32, "max_gpus": 2,
                        "command": [sys.executable, "train.py"]}).to_proto()
    spec.code_sha256 = sha
    job_id = client._stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
    done = client.wait(job_id, timeout=60)
    assert done.state == "FAILED"
    assert done.failed_exit_code == 127  # never started
    said = "\n".join(client.logs(job_id))  # what `frenzy logs` and `frenzy job` show
    assert why in said and "could not be unpacked" in said, said
    assert not any(Path(stack.run_dir).rglob("escaped.txt"))
    assert not list(Path(stack.run_dir).rglob(f"code/{sha}"))  # nothing of it cached
