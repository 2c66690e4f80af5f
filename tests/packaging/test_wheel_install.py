"""The install a user gets, not the editable one the tests run in (issue 30).

An editable install reads the source tree, so a package left out of the wheel (frenzy.auth was)
goes unnoticed until someone runs `pip install .`. Here the tree is copied the way
docker/Dockerfile copies it, a wheel is built from the copy and installed into a fresh virtual
environment without extras -- what `pip install frenzy` gives a user who only submits jobs --
and that install must answer `frenzy --help`, `frenzy --version`, `from frenzy import Client`, and
run a job through the SDK on a live stack. Then the Dockerfile's own install command (read from
the Dockerfile, not repeated here) adds the server extra to the same environment, and the server
side must import and list its commands.

The wheel is built pure Python (FRENZY_PURE_PYTHON=1): the mypyc build is what `make` runs for
every other test, and compiling it again here would cost minutes of CI for nothing this checks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from frenzy.devstack.stack import LocalStack
from has.cluster_spec import parse_cluster

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
CLUSTER = {"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 2, "name_prefix": "a100"}]}
SERVER_ONLY = ("redis", "celery", "fastapi", "uvicorn", "prometheus_client", "cryptography", "pynvml")


def _dockerfile_copies() -> list[str]:
    """The paths the Dockerfile copies into the image, as it names them."""
    paths: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            *sources, _dest = line.split()[1:]
            paths += sources
    return paths


def _dockerfile_install() -> str:
    """The Dockerfile's `RUN pip install ...` command, up to the first `&&`."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    match = re.search(r"^RUN (pip install [^&\n]+)", text, re.MULTILINE)
    assert match, "docker/Dockerfile has no `RUN pip install ...` step"
    return match.group(1).strip()


def _run(cmd: list[str] | str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, shell=isinstance(cmd, str), capture_output=True, text=True,
                          timeout=timeout)
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(source copy, fresh virtual environment, its environment) with the client wheel installed."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for rel in _dockerfile_copies():
        origin = ROOT / rel
        assert origin.exists(), f"docker/Dockerfile copies {rel}, which the tree lacks"
        if origin.is_dir():
            shutil.copytree(origin, src / rel, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "_native.json", "*.egg-info", "build"))
        else:
            shutil.copy2(origin, src / rel)
    env_dir = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    bin_dir = env_dir / "bin"
    # Nothing of the test run's own install may leak in: a clean PATH and no PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "REDIS_URL",
                                                             "FRENZY_CREDENTIALS", "FRENZY_TOKEN",
                                                             "FRENZY_SCHEDULER")}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", FRENZY_PURE_PYTHON="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               HOME=str(base / "home"), XDG_CONFIG_HOME=str(base / "home" / ".config"))
    built = _run([str(bin_dir / "pip"), "wheel", "--no-deps", "-w", str(base / "dist"), "."], src, env)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheels = list((base / "dist").glob("frenzy-*.whl"))
    assert len(wheels) == 1, wheels
    import zipfile

    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for typed in ("frenzy/py.typed", "marp/py.typed", "has/py.typed"):  # PEP 561: the types ship
        assert typed in names, f"the wheel lacks {typed}"
    installed = _run([str(bin_dir / "pip"), "install", str(wheels[0])], base, env)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    yield src, env_dir, env


def test_the_client_install_has_no_server_packages(venv: tuple[Path, Path, dict[str, str]]) -> None:
    _, env_dir, env = venv
    probe = f"import importlib.util as u; print([m for m in {SERVER_ONLY!r} if u.find_spec(m)])"
    out = _run([str(env_dir / "bin" / "python"), "-c", probe], env_dir, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"the client install pulled in server packages: {out.stdout}"


def test_help_version_and_import_from_the_wheel(venv: tuple[Path, Path, dict[str, str]]) -> None:
    _, env_dir, env = venv
    frenzy = str(env_dir / "bin" / "frenzy")
    helped = _run([frenzy, "--help"], env_dir, env)
    assert helped.returncode == 0, helped.stderr
    assert "submit" in helped.stdout and "predict" in helped.stdout
    version = _run([frenzy, "--version"], env_dir, env)
    assert version.returncode == 0, version.stderr
    from frenzy import __version__

    assert version.stdout.strip() == f"frenzy {__version__}"
    imported = _run([str(env_dir / "bin" / "python"), "-c",
                     "from frenzy import Client, AsyncClient; import frenzy, frenzy.auth; print(frenzy.__version__)"],
                    env_dir, env)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == __version__
    # A local prediction needs no server: MARP ships in the client.
    predicted = _run([frenzy, "predict", "--model", "gpt2-124m", "--seq-len", "512", "--global-batch", "8",
                      "--json"], env_dir, env)
    assert predicted.returncode == 0, predicted.stderr
    # A server command says what to install instead of a traceback.
    up = _run([frenzy, "up"], env_dir, env)
    assert up.returncode == 1
    assert "pip install 'frenzy[server]'" in up.stderr and "Traceback" not in up.stderr


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = LocalStack.create(parse_cluster(CLUSTER), run_dir=str(tmp_path_factory.mktemp("run")), redis_url=redis_url,
                          prefix=f"t{uuid.uuid4().hex[:10]}", with_worker=False, heartbeat_s=0.5, ttl_s=3)
    s.start()
    yield s
    s.stop()


def test_the_sdk_from_the_wheel_runs_a_job_on_a_live_stack(venv: tuple[Path, Path, dict[str, str]],
                                                           stack: LocalStack, tmp_path: Path) -> None:
    _, env_dir, env = venv
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os\nprint('wheel job ran with tp', os.environ['FRENZY_TP'])\n")
    script = textwrap.dedent(f"""
        import sys
        from frenzy import Client
        with Client({stack.scheduler_addr!r}, {stack.token!r}) as client:
            job = client.submit(model="gpt2-124m", seq_len=512, global_batch=8,
                                command=[{sys.executable!r}, "train.py"], code_dir=".")
            job = job.wait(timeout=120)
            print(job.state)
            for line in client.logs(job.id):
                print(line)
    """)
    ran = _run([str(env_dir / "bin" / "python"), "-c", script], project, env, timeout=180)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert ran.stdout.splitlines()[0] == "SUCCEEDED", ran.stdout
    assert "wheel job ran with tp 1" in ran.stdout, ran.stdout
    # The wheel's CLI reads the same job back.
    listed = _run([str(env_dir / "bin" / "frenzy"), "jobs", "--json"], project,
                  {**env, "FRENZY_SCHEDULER": stack.scheduler_addr, "FRENZY_TOKEN": stack.token})
    assert listed.returncode == 0, listed.stderr
    assert '"SUCCEEDED"' in listed.stdout


def test_the_dockerfile_install_adds_the_server_side(venv: tuple[Path, Path, dict[str, str]]) -> None:
    src, env_dir, env = venv
    command = _dockerfile_install()
    assert "[server]" in command, f"the image must install the server extra: {command}"
    installed = _run(command, src, env)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    python, frenzy = str(env_dir / "bin" / "python"), str(env_dir / "bin" / "frenzy")
    imported = _run([python, "-c", "import frenzy.scheduler.service, frenzy.api.app, frenzy.worker.app, "
                                   "frenzy.agent.daemon, frenzy.devstack.stack"], env_dir, env)
    assert imported.returncode == 0, imported.stderr[-3000:]
    helped = _run([frenzy, "scheduler", "--help"], env_dir, env)
    assert helped.returncode == 0, helped.stderr
    assert "--redis-url" in helped.stdout and "needs the server extra" not in helped.stdout
