"""The job environment policy (``jobenv``) and ``--run-as`` resolution: pure, no Redis."""

from __future__ import annotations

import os
import pwd

import pytest

from frenzy.agent import jobenv
from frenzy.agent.run_as import resolve


def test_inherited_keeps_the_allowlist_and_pass_env_only() -> None:
    agent = {"PATH": "/bin", "LC_ALL": "C", "LD_LIBRARY_PATH": "/cuda", "NCCL_IB_HCA": "mlx5", "OTHER": "x",
             "REDIS_URL": "redis://h", "NCCL_TOKEN": "t", "CUDA_VISIBLE_DEVICES": "0", "FRENZY_PREFIX": "p"}
    assert jobenv.inherited(agent) == {"PATH": "/bin", "LC_ALL": "C", "LD_LIBRARY_PATH": "/cuda"}
    assert jobenv.inherited(agent, ["NCCL_*", "OTHER", "CUDA_*"]) == {
        "PATH": "/bin", "LC_ALL": "C", "LD_LIBRARY_PATH": "/cuda", "NCCL_IB_HCA": "mlx5", "OTHER": "x"}


@pytest.mark.parametrize("name", ["REDIS_URL", "redis_url", "FRENZY_TOKEN", "MY_SECRET", "X_PASSWORD_FILE",
                                  "HF_TOKEN", "*", "FRENZY_*", "REDIS_*", "FRENZY_CRED*", "", "A*B", "A=B",
                                  "CUDA_VISIBLE_DEVICES", "FRENZY_NODE", "PET_NNODES"])
def test_pass_env_refuses_credentials_reserved_names_and_nonsense(name: str) -> None:
    with pytest.raises(ValueError, match="--pass-env"):
        jobenv.check_pass_env([name])


def test_pass_env_accepts_names_and_prefixes() -> None:
    assert jobenv.check_pass_env(["NCCL_*", "WANDB_MODE", "CUDA_*"]) == ("NCCL_*", "WANDB_MODE", "CUDA_*")


def test_extra_env_refuses_frenzy_credentials_and_reserved_names_but_takes_an_operators_secret() -> None:
    assert jobenv.check_extra_env({"HF_TOKEN": "x", "PATH": "/opt/bin"}) == {"HF_TOKEN": "x", "PATH": "/opt/bin"}
    for name in ("REDIS_URL", "FRENZY_TOKEN", "FRENZY_JOB_ID", "MASTER_PORT"):
        with pytest.raises(ValueError, match=f"--env {name}"):
            jobenv.check_extra_env({name: "v"})


def test_reserved_and_unrepresentable_names_in_a_jobs_env() -> None:
    env = {"WANDB": "1", "FRENZY_X": "1", "PET_RDZV_ID": "1", "NODE_RANK": "3", "PYTHONPATH": "/src",
           "LD_PRELOAD": "libtcmalloc.so"}
    assert jobenv.reserved_in(env) == ["FRENZY_X", "NODE_RANK", "PET_RDZV_ID"]
    assert jobenv.bad_names_in({"A=B": "1", "OK": "x\x00y", "FINE": "1"}) == ["A=B", "OK"]


def test_run_as_resolves_names_and_uids() -> None:
    me = pwd.getpwuid(os.geteuid())
    user = resolve(me.pw_name)
    assert (user.uid, user.gid, user.home) == (me.pw_uid, me.pw_gid, me.pw_dir) and not user.switches()
    assert resolve(str(me.pw_uid)) == user
    assert user.login_env()["USER"] == me.pw_name and me.pw_gid in user.groups
    with pytest.raises(ValueError, match="no such user"):
        resolve("99999999999999999999")


def test_the_checkpoint_dir_is_the_job_id_right_under_an_absolute_root() -> None:
    assert jobenv.checkpoint_dir("/shared/ckpt/", "job-7") == "/shared/ckpt/job-7"
    assert jobenv.checkpoint_dir("/shared//ckpt", "j.1_a") == "/shared/ckpt/j.1_a"


@pytest.mark.parametrize("root", ["", "ckpt", "./ckpt", "~/ckpt", "/a\x00b"])
def test_a_checkpoint_root_must_be_an_absolute_path(root: str) -> None:
    with pytest.raises(ValueError, match="--checkpoint-root .*absolute path"):
        jobenv.check_checkpoint_root(root)


@pytest.mark.parametrize("job_id", ["..", ".", "../x", "a/../../b", "a/b", "/etc", "", "a..b", "-x", "a b"])
def test_no_job_id_names_anything_but_a_directory_right_under_the_root(job_id: str) -> None:
    with pytest.raises(ValueError, match="job id"):
        jobenv.checkpoint_dir("/shared/ckpt", job_id)
