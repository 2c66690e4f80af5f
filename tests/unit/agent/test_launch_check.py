"""Whether the agent accepts a launch (``launch_check.check_launch``), from gathered facts: no Redis."""

from __future__ import annotations

from dataclasses import replace

from frenzy.agent.launch_check import GpuHolder, LaunchFacts, check_launch, report_unusable
from frenzy.state.messages import LaunchMessage, LayoutEnv
from frenzy.state.signing import Refusal


def launch(**fields) -> LaunchMessage:
    base = dict(job_id="j", attempt=1, fence=7, node="a", node_rank=0, nnodes=2, nproc_per_node=2,
                gpu_indices=[0, 1], gpu_uuids=["GPU-0", "GPU-1"], master_addr="10.0.0.1", master_port=29500,
                rdzv_id="j-1", command=["true"],
                layout=LayoutEnv(gpu_type="L4", tp=1, pp=1, dp=4, zero_stage=0, micro_batch=1, grad_accum=1))
    return LaunchMessage(**{**base, **fields})


FACTS = LaunchFacts(node="a", gpu_uuids={0: "GPU-0", 1: "GPU-1", 2: "GPU-2"}, port_busy=False,
                    holders={0: GpuHolder("j", "7"), 1: GpuHolder("j", "7")})


def test_a_launch_matching_every_fact_is_accepted() -> None:
    verdict = check_launch(launch(), FACTS)
    assert verdict.ok and verdict.problem is None


def test_a_launch_whose_fence_does_not_match_is_refused_and_retryable() -> None:
    # (a job that moved on drops the refusal as stale; its live attempt is requeued, not failed)
    facts = replace(FACTS, holders={0: GpuHolder("j", "7"), 1: GpuHolder("other", "8")})
    verdict = check_launch(launch(), facts)
    assert not verdict.ok and verdict.retryable
    assert verdict.problem == ("stale launch: GPU 1 is held by 'other' with fence 8, but this launch is for "
                               "job 'j' with fence 7")
    freed = replace(FACTS, holders={0: GpuHolder("j", "7"), 1: GpuHolder("", None)})
    assert "held by 'nobody' with fence None" in str(check_launch(launch(), freed).problem)


def test_without_fence_verification_the_holders_are_not_looked_at() -> None:
    assert check_launch(launch(), replace(FACTS, holders=None)).ok


def test_a_launch_for_another_node_or_missing_gpus_is_refused() -> None:
    assert check_launch(launch(node="b"), FACTS).problem == "launch addressed to node 'b' arrived at node 'a'"
    verdict = check_launch(launch(gpu_indices=[0, 5]), FACTS)
    assert verdict.problem == "GPU index(es) [5] do not exist on node a (it has [0, 1, 2])" and not verdict.retryable


def test_a_gpu_that_changed_under_its_index_is_refused() -> None:
    verdict = check_launch(launch(gpu_uuids=["GPU-0", "GPU-9"]), FACTS)
    assert verdict.problem == "GPU 1 on node a is GPU-1, but the launch expects GPU-9"
    # an unknown UUID on either side is not a mismatch
    assert check_launch(launch(gpu_uuids=["", "GPU-1"]), FACTS).ok


def test_a_busy_rendezvous_port_refuses_the_master_only_and_may_be_retried_elsewhere() -> None:
    busy = replace(FACTS, port_busy=True)
    verdict = check_launch(launch(), busy)
    assert not verdict.ok and verdict.retryable and "rendezvous port 29500 on node a is in use" in str(verdict.problem)
    assert check_launch(launch(node_rank=1), busy).ok  # not the master
    assert check_launch(launch(nnodes=1), busy).ok  # single node: torchrun picks its own port


def test_a_job_env_setting_a_reserved_variable_is_refused_naming_it() -> None:
    verdict = check_launch(launch(env={"OK": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "FRENZY_LOG_DIR": "/x"}), FACTS)
    assert not verdict.ok and not verdict.retryable
    assert str(verdict.problem).startswith("the job's env sets CUDA_VISIBLE_DEVICES, FRENZY_LOG_DIR, which Frenzy")
    assert "NUL" in str(check_launch(launch(env={"A=B": "1"}), FACTS).problem)


def test_a_workdir_must_resolve_under_an_allowed_root() -> None:
    facts = replace(FACTS, workdir_roots=("/home/u", "/tmp"))
    assert check_launch(launch(workdir="/home/u/run"), replace(facts, workdir="/home/u/run")).ok
    assert check_launch(launch(workdir="/tmp"), replace(facts, workdir="/tmp")).ok
    verdict = check_launch(launch(workdir="/tmp/etc"), replace(facts, workdir="/etc"))
    assert verdict.problem == ("working directory '/tmp/etc' (resolved: /etc) is outside the directories jobs may "
                               "run in on node a (/home/u, /tmp); the node's operator can allow more with the "
                               "agent's --workdir-root")
    assert not check_launch(launch(workdir="/home/user2"), replace(facts, workdir="/home/user2")).ok  # not a prefix
    assert check_launch(launch(), facts).ok  # no workdir: the agent's own directory


def test_a_node_that_would_fence_the_job_at_once_does_not_start_it() -> None:
    cut_off = replace(FACTS, silent_s=4.0, fence_after_s=3.0)
    verdict = check_launch(launch(), cut_off)
    assert not verdict.ok and verdict.retryable
    assert verdict.problem == ("node a has had no heartbeat reach Redis for 4.0s and stops its jobs after 3.0s "
                               "(it may be declared dead): not starting one here")
    assert check_launch(launch(), replace(cut_off, silent_s=2.9)).ok
    assert check_launch(launch(), replace(cut_off, fence_after_s=None)).ok  # a launch that never fences


# ---- entries refused before they are judged as launches (report_unusable)

SEALED = {"kind": "launch", "job_id": "j", "attempt": 2, "fence": 7, "node": "a", "expires_at": 1000,
          "nonce": "n", "sig": "s"}


def test_only_the_schedulers_own_launches_are_answered() -> None:
    # Nothing for what the scheduler did not seal: answering would act for whoever wrote it.
    for refusal in (Refusal.UNSIGNED, Refusal.FORGED, Refusal.NO_KEY, Refusal.REPLAYED):
        assert report_unusable(SEALED, refusal, refusal.value, "a") is None
    expired = report_unusable(SEALED, Refusal.EXPIRED, "expired", "a")
    assert expired is not None and (expired.job_id, expired.attempt, expired.fence) == ("j", 2, 7)
    assert expired.retryable and expired.message.startswith("node a refused the launch: its seal expired")
    unreadable = report_unusable(SEALED, None, "invalid agent command: gpu_indices: Field required", "a")
    assert unreadable is not None and "cannot read the launch (invalid agent command: gpu_indices" in unreadable.message


def test_an_unusable_entry_is_not_answered_for_an_attempt_running_here_or_without_a_job() -> None:
    assert report_unusable(SEALED, Refusal.EXPIRED, "expired", "a", running=[("j", 2)]) is None
    assert report_unusable(SEALED, Refusal.EXPIRED, "expired", "a", running=[("j", 1)]) is not None
    assert report_unusable({**SEALED, "kind": "cancel"}, Refusal.EXPIRED, "expired", "a") is None
    assert report_unusable({**SEALED, "job_id": "../x"}, None, "bad", "a") is None
    assert report_unusable({**SEALED, "attempt": True}, None, "bad", "a") is None
    assert report_unusable({**SEALED, "attempt": 0}, None, "bad", "a") is None
    no_fence = report_unusable({**SEALED, "fence": "7"}, None, "bad", "a")
    assert no_fence is not None and no_fence.fence is None
