"""issue 34, item 1 ("a job runs as its user, alone"): two tenants on one node.

Measured before (same review): with every job under one account (`frenzy up`, or the documented
``--run-as nobody``), alice's job read bob's environment (an API key) from /proc/PID/environ, read
his code through /proc/PID/cwd, overwrote his output, stopped his process with SIGSTOP, and read
job logs, run directories and checkpoints, all world-readable (0644/0755).

Here a real agent (root) runs on the test Redis with ``--user-map``: alice -> one Unix account,
bob -> another, both made with useradd for this module and removed after. Bob's job holds a
secret in its environment, runs from packed code and writes output, a checkpoint and a tmp file;
alice's job then tries each attack and prints what it got. Every test fails on the code before
this change (there, no map: both jobs shared the ``--run-as`` account and every attack worked, as
measured in the issue; ``Agent(user_map=...)`` did not exist either).

What the kernel gives here is what the host allows without containers: separate uids, 0700/0600
files, a private TMPDIR, and a cgroup per job where cgroup v2 is writable (checked in
``test_a_job_cannot_outlive_its_end_through_a_daemon``). /proc's other processes stay visible
(hidepid is the operator's mount option, docs/operators.md); their environ and cwd do not.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from integration.agent import conftest as agent_fixtures
from integration.agent.agent_cluster import Cluster

from frenzy.agent import cgroups, launcher
from frenzy.agent.usermap import UserMap, parse
from frenzy.code.pack import pack
from frenzy.state.messages import EventKind

cluster = agent_fixtures.cluster

ALICE, BOB, SYSTEM = "fz34alice", "fz34bob", "fz34sys"
SECRET = "sk-bob-0123456789"
PY = "/usr/bin/python3"  # (the test's own interpreter may live under root's 0700 home)


def _useradd(name: str, system: bool = False) -> None:
    args = ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh", "--user-group"]
    subprocess.run([*args, *(["--system"] if system else []), name], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, pwd.struct_passwd]]:
    """alice's and bob's Unix accounts (ordinary, uid >= 1000) and a system one, removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("two tenants need root and useradd to make their accounts")
    made = []
    try:
        for name, system in ((ALICE, False), (BOB, False), (SYSTEM, True)):
            try:
                pwd.getpwnam(name)
            except KeyError:
                try:
                    _useradd(name, system)
                except (OSError, subprocess.SubprocessError) as exc:
                    pytest.skip(f"cannot make test accounts with useradd here: {exc}")
                made.append(name)
        yield {name: pwd.getpwnam(name) for name in (ALICE, BOB, SYSTEM)}
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.fixture
def place(cluster: Cluster) -> Iterator[Path]:
    """Log, state and checkpoint directories jobs of other accounts can reach (pytest's tmp is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="frenzy-tenants-", dir="/tmp"))
    os.chmod(path, 0o711)
    cluster.log_dir = path / "logs"
    yield path
    for running in cluster.agents:  # (before its directories go)
        running.stop.set()
        running.thread.join(10)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def two(cluster: Cluster, place: Path, accounts: dict, redis_url: str) -> Iterator[dict]:
    """A root agent with alice and bob mapped; bob's job running (secret env, packed code, output)."""
    user_map = place / "users"
    user_map.write_text(f"# frenzy user  unix account\nalice {ALICE}\nbob {BOB}\n")
    cluster.start(user_map=str(user_map), checkpoint_root=str(place / "checkpoints"), cgroup_root="auto")
    raw = redis.Redis.from_url(redis_url)
    code = place / "bobcode"
    code.mkdir()
    (code / "train.py").write_text("# bob's unpublished model\nMAGIC = 'bob-code-7f3a'\n")
    packed = pack(code)
    raw.set(cluster.keys.code(packed.sha256), packed.data)
    raw.close()
    bob_script = ('echo "$FRENZY_CHECKPOINT_DIR" > /dev/null; echo out > result.txt; '
                  'echo ckpt > "$FRENZY_CHECKPOINT_DIR/step1"; echo tmp > "$TMPDIR/scratch"; '
                  'echo "bob logs a line"; echo "$$ $(pwd)" > "$FRENZY_RUN_DIR/whoami"; exec sleep 60')
    cluster.launch("job-bob", ["/bin/sh", "-c", bob_script], indices=[0], fence=1, user="bob",
                   code_sha256=packed.sha256, env={"BOB_API_KEY": SECRET})
    running = cluster.wait_event("job-bob", EventKind.RUNNING)
    run_dir = launcher.run_dir_for(running.log_path or "")
    info: dict = {}
    deadline = time.monotonic() + 10
    while not (run_dir / "whoami").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid_text, cwd = (run_dir / "whoami").read_text().split()
    info.update(bob_pid=int(pid_text), bob_cwd=cwd, bob_log=running.log_path, bob_run=str(run_dir),
                bob_ckpt=str(place / "checkpoints" / "job-bob"), shim=running.pid)
    yield info
    if _alive(info["bob_pid"]):
        os.kill(info["bob_pid"], signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


ATTACK = r'''
import json, os, signal, sys
t = json.loads(sys.argv[1])
def try_(name, fn):
    try:
        got = fn()
        print(f"{name}: GOT {str(got)[:80]!r}")
    except OSError as exc:
        print(f"{name}: refused ({type(exc).__name__})")
try_("environ", lambda: open(f"/proc/{t['bob_pid']}/environ", "rb").read().decode(errors="replace"))
try_("cwd", lambda: os.listdir(f"/proc/{t['bob_pid']}/cwd"))
try_("code", lambda: open(os.path.join(t["bob_cwd"], "train.py")).read())
try_("output", lambda: open(os.path.join(t["bob_cwd"], "result.txt"), "a").write("alice was here"))
try_("log", lambda: open(t["bob_log"]).read())
try_("rundir", lambda: os.listdir(t["bob_run"]))
try_("tmp", lambda: open(os.path.join(t["bob_run"], "tmp", "scratch")).read())
try_("ckpt", lambda: os.listdir(t["bob_ckpt"]))
try_("ckpt-write", lambda: open(os.path.join(t["bob_ckpt"], "evil"), "w").write("x"))
try_("sigstop", lambda: os.kill(t["bob_pid"], signal.SIGSTOP))
try_("shim", lambda: os.kill(t["shim"], signal.SIGKILL))
try_("agent-environ", lambda: open(f"/proc/{t['agent']}/environ", "rb").read().decode(errors="replace"))
try_("ledger", lambda: os.listdir(t["ledger"]))
try_("ledger-jobs", lambda: os.listdir(t["ledger"] + "/n1.jobs"))
try_("joblist", lambda: os.listdir(t["logs"]))
print("uid", os.getuid(), "tmpdir", os.environ.get("TMPDIR"))
'''


def _attack(cluster: Cluster, two: dict, job_id: str = "job-alice", user: str = "alice") -> dict[str, str]:
    target = {**two, "agent": os.getpid(), "ledger": str(cluster.log_dir / ".agent"), "logs": str(cluster.log_dir)}
    cluster.launch(job_id, [PY, "-c", ATTACK, json.dumps(target)], indices=[1], fence=2, user=user)
    exited = cluster.wait_event(job_id, EventKind.EXITED, timeout=20)
    text = Path(exited.log_path or "").read_text()
    assert exited.exit_code == 0, text
    results = {}
    for line in text.splitlines():
        name, sep, what = line.partition(": ")
        if sep and not name.startswith("#"):
            results[name] = what
    results["_text"] = text
    return results


def test_alice_cannot_read_bobs_environment_code_output_or_logs(cluster: Cluster, two: dict, accounts: dict) -> None:
    got = _attack(cluster, two)
    text = got.pop("_text")
    assert f"uid {accounts[ALICE].pw_uid} " in text  # alice's job ran as alice's account
    assert SECRET not in text
    for attack in ("environ", "cwd", "code", "output", "log", "rundir", "tmp", "ckpt", "ckpt-write"):
        assert got[attack].startswith("refused"), (attack, got[attack], text)
    assert (Path(two["bob_cwd"]) / "result.txt").read_text() == "out\n"  # not overwritten


def test_alice_cannot_signal_bobs_processes(cluster: Cluster, two: dict) -> None:
    got = _attack(cluster, two)
    assert got["sigstop"].startswith("refused") and got["shim"].startswith("refused"), got
    state = Path(f"/proc/{two['bob_pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state in ("S", "R"), state  # not stopped (T)


def test_alice_cannot_read_frenzy_credentials_or_list_jobs(cluster: Cluster, two: dict) -> None:
    """The agent's environment (its REDIS_URL in production), its ledger, and the list of jobs."""
    got = _attack(cluster, two)
    for attack in ("agent-environ", "ledger", "ledger-jobs", "joblist"):
        assert got[attack].startswith("refused"), (attack, got[attack])


def test_each_tenant_owns_its_files_with_private_modes(cluster: Cluster, two: dict, accounts: dict) -> None:
    bob = accounts[BOB].pw_uid
    for path, mode in ((two["bob_log"], 0o600), (two["bob_run"], 0o700), (two["bob_run"] + "/tmp", 0o700),
                       (two["bob_ckpt"], 0o700), (two["bob_cwd"], 0o700)):
        info = os.stat(path)
        assert (info.st_uid, info.st_mode & 0o777) == (bob, mode), (path, oct(info.st_mode), info.st_uid)
    attempt = Path(two["bob_log"]).parent
    assert attempt.stat().st_mode & 0o777 == 0o711 and attempt.parent.stat().st_mode & 0o777 == 0o711


def test_a_user_without_a_mapping_is_refused_and_says_what_to_add(cluster: Cluster, two: dict) -> None:
    cluster.launch("job-carol", ["/bin/true"], indices=[1], fence=3, user="carol")
    failed = cluster.wait_event("job-carol", EventKind.LAUNCH_FAILED)
    assert "user 'carol' has no Unix account on node n1" in (failed.message or "")
    assert "'carol ACCOUNT'" in (failed.message or "") and not failed.retryable


def test_root_and_system_accounts_are_refused_in_the_map(accounts: dict, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="line 2: account 'root' is root"):
        parse(f"alice {ALICE}\nmallory root\n")
    with pytest.raises(ValueError, match=rf"line 1: account '{SYSTEM}' \(uid \d+\) is a system account"):
        parse(f"eve {SYSTEM}\n")
    with pytest.raises(ValueError, match="is mapped twice"):
        parse(f"alice {ALICE}\nalice {BOB}\n")
    assert parse(f"sysjobs {SYSTEM}\n", min_uid=100)["sysjobs"].name == SYSTEM  # a lower floor, by choice
    bad = tmp_path / "users"
    bad.write_text("mallory 0\n")
    with pytest.raises(ValueError, match="is root"):
        UserMap(str(bad))


def test_the_map_is_reread_when_it_changes(cluster: Cluster, two: dict, accounts: dict) -> None:
    user_map = Path(cluster.log_dir).parent / "users"
    user_map.write_text(f"alice {ALICE}\nbob {BOB}\ncarol {ALICE}\n")
    cluster.launch("job-carol2", ["/usr/bin/id", "-u"], indices=[1], fence=4, user="carol")
    exited = cluster.wait_event("job-carol2", EventKind.EXITED)
    assert f"\n{accounts[ALICE].pw_uid}\n" in Path(exited.log_path or "").read_text()


def test_a_job_cannot_outlive_its_end_through_a_daemon(cluster: Cluster, place: Path, accounts: dict) -> None:
    """A job leaves a daemon that cleared its environment (no FRENZY_LAUNCH_ID), left its session and
    re-parented to init (the exec'd shim is no subreaper): the job's cgroup still ends it. Where cgroup
    v2 is not writable the agent says so and this test skips."""
    user_map = place / "users"
    user_map.write_text(f"alice {ALICE}\n")
    running = cluster.start(user_map=str(user_map), cgroup_root="auto", use_spawner=False)
    if not running.agent.cgroups.enabled:
        pytest.skip(f"no cgroup v2 here: {running.agent.cgroups.why_not}")
    pidfile = place / "daemon.pid"
    os.chmod(place, 0o733)  # alice may leave the daemon's pid there
    daemon = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        open('{pidfile}', 'w').write(str(os.getpid()))\n"
              f"        os.execve('/bin/sleep', ['sleep', '120'], {{}})\n    os._exit(0)\ntime.sleep(0.5)\n")
    cluster.launch("job-daemon", [PY, "-c", daemon], indices=[0], fence=5, user="alice")
    cluster.wait_event("job-daemon", EventKind.EXITED, timeout=20)
    pid = int(pidfile.read_text())  # (written before the job's leader exits: it waits half a second)
    deadline = time.monotonic() + 5
    while _alive(pid) and launcher.process_running(pid, None) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not launcher.process_running(pid, None), "the job's daemon outlived it"
    assert not os.path.exists(running.agent.cgroups.path_for("job-daemon", 1))  # removed with the job
    assert cgroups.cgroup2_mount() is not None
