"""The node agent: registers this host's GPUs, heartbeats, and runs what the scheduler sends.

One ``Agent.run(stop)`` call is the whole daemon. Threads: the caller's thread
reads the node's launch stream (consumer group ``AGENT_GROUP``, consumer = node
name); a heartbeat thread renews the alive lease and the GPUs' live state; a
log thread ships every job's output into its Redis log stream; one watcher per
job waits for its process and reports the exit.

No lost or doubled launch: every stream entry is acknowledged only after its
effect (process started, event written) is done, so a crash re-delivers it.
A redelivered launch is matched against what already runs: the local ledger
of started jobs, and, for a crash between starting the process and writing
the ledger, the processes in /proc carrying the launch's id. Either way it
becomes "already running", never a second start. Jobs outlive the agent; a
restarted agent adopts them, reads the exit status their shim recorded, and
resumes shipping their logs where the last run stopped.

Nothing in the launch stream is trusted unsigned: every launch and cancel must be
sealed with this node's key (``frenzy.state.signing``), in time and never seen
before; anything else is refused before any other check, acknowledged, logged (one
warning naming the node, the job and why) and counted in the node hash's
``refused_launches``. A launch that *is* the scheduler's but is not run (its seal expired before
Redis took it, or this agent cannot read it: an older version) is answered at once with a
LAUNCH_FAILED event as this node, so the job is requeued now (``launch_check.report_unusable``);
a forged, unsigned or replayed one never is: answering it would act for whoever wrote it. Every
other launch that is not started is answered the same way, with the reason (``_launch``).
The agent signs its own events with the same key. It reads the
key from Redis at start (no key: it does not start, ``NodeKeyMissing``) and again
with every heartbeat, so a rotation reaches it without a restart (``node_seal.NodeSeal``).

Whether a launch may run here is judged by ``launch_check.check_launch`` (pure)
over facts this module gathers (GPUs, the rendezvous port, owner and fence of
the launch's GPUs in Redis, the job's resolved working directory).

A launch that carries packed code (``code_sha256``) runs in a fresh copy of it: fetched from
Redis, its sha256 checked, unpacked once per hash with nothing allowed outside
(``frenzy.agent.codecache``); a blob that is missing, corrupt or unsafe fails the launch with
the reason in the event and in the job's log.

Jobs run clean: their environment is an allowlist of the agent's (never its
Redis address or a credential), their logs stay under the log directory, their
working directory under a ``--workdir-root``, and with ``--run-as`` they run as
that user. The options are checked here, when the agent starts: a bad one stops
the agent with a clear error instead of failing launches later.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import redis

from frenzy.agent import cgroups, jobenv, launcher
from frenzy.agent.cgroups import DEFAULT_PIDS_MAX, JobCgroups
from frenzy.agent.codecache import CachePolicy, CodeCache, CodeUnavailable, PruneReport
from frenzy.agent.exit_report import exit_report
from frenzy.agent.fencing import fence_deadline_s, redis_is_down, to_fence
from frenzy.agent.gpus import GpuBackend, GpuInfo, NvmlBackend
from frenzy.agent.jobproc import JobProcess, append_line, append_trailer, ended
from frenzy.agent.launch_check import (
    GpuHolder,
    LaunchFacts,
    LaunchVerdict,
    check_launch,
    opens_rendezvous,
    report_unusable,
)
from frenzy.agent.ledger import Ledger
from frenzy.agent.logship import LogShipper
from frenzy.agent.metrics import AgentMetrics, refusal_label
from frenzy.agent.node_seal import NodeSeal
from frenzy.agent.peak import job_gpu_bytes
from frenzy.agent.registration import DECLARED_DEAD, MISSING, NodeRegistration
from frenzy.agent.run_as import JobUser
from frenzy.agent.run_as import resolve as resolve_user
from frenzy.agent.spawning import Spawner
from frenzy.agent.usermap import DEFAULT_MIN_UID, UnmappedUser, UserMap
from frenzy.state import connect, scripts
from frenzy.state.code_store import CodeReader
from frenzy.state.connect import agent_timeouts
from frenzy.state.keys import AGENT_GROUP, Keys
from frenzy.state.messages import (
    AgentEvent,
    BadMessage,
    CancelMessage,
    EventKind,
    LaunchMessage,
    command_from,
    is_safe_name,
    payload,
)
from frenzy.state.node_keys import NodeKeyMissing
from frenzy.state.signing import Refusal
from frenzy.state.streams import ensure_group, xreadgroup_entries

log = logging.getLogger(__name__)

_RETRY_S = 1.0  # pause after a Redis error before trying again
# How often the heartbeat thread prunes the code cache and old working directories: a walk of a
# few directories, and nothing there grows fast enough to need more.
PRUNE_EVERY_S = 600.0


class Agent:
    """The node agent daemon; see the module docstring. Construct, then ``run(stop_event)``."""

    def __init__(
        self,
        redis_url: str,
        node: str,
        backend: GpuBackend,
        keys: Keys | None = None,
        addr: str = "127.0.0.1",
        heartbeat_s: float = 2.0,
        ttl_s: float = 10.0,
        log_dir: str | os.PathLike[str] = "./var/logs",
        block_s: float = 1.0,
        cancel_grace_s: float = 10.0,
        kill_on_exit: bool = False,
        verify_fence: bool = True,
        state_dir: str | os.PathLike[str] | None = None,
        extra_env: dict[str, str] | None = None,
        log_poll_s: float = 0.25,
        log_stream_maxlen: int = 10_000,
        log_retention_s: float = 7 * 24 * 3600,
        pass_env: list[str] | tuple[str, ...] = (),
        workdir_roots: list[str | os.PathLike[str]] | None = None,
        run_as: str | None = None,
        checkpoint_root: str | os.PathLike[str] | None = None,
        cache_policy: CachePolicy | None = None,
        use_spawner: bool = True,
        user_map: str | os.PathLike[str] | None = None,
        min_job_uid: int = DEFAULT_MIN_UID,
        unmapped: str = "refuse",
        cgroup_root: str = "off",
        job_memory_max: int | None = None,
        job_pids_max: int | None = DEFAULT_PIDS_MAX,
        price_per_gpu_hour: float | None = None,
    ) -> None:
        if not is_safe_name(node):
            raise ValueError(f"node name {node!r}: use letters, digits, '.', '_' and '-' (at most 128, starting "
                             "with a letter or digit, no '..'); give one with --node")
        if heartbeat_s <= 0 or ttl_s <= heartbeat_s:
            raise ValueError(
                f"need 0 < heartbeat_s < ttl_s (got heartbeat_s={heartbeat_s}, ttl_s={ttl_s}): "
                "the lease must outlive the gap between two heartbeats"
            )
        if price_per_gpu_hour is not None and not 0 <= price_per_gpu_hour <= 1e6:
            raise ValueError(f"--price-per-gpu-hour: dollars per GPU-hour in 0..1000000, got {price_per_gpu_hour}")
        # The operator's own rate for this node's GPUs (None: the catalog's list price); plans are
        # priced and attempts charged with it (docs/cost.md).
        self.price_per_gpu_hour = price_per_gpu_hour
        self.node = node
        self.backend = backend
        self.keys = keys or Keys()
        self.addr = addr
        self.heartbeat_s = heartbeat_s
        self.ttl_s = ttl_s
        self.log_dir = Path(log_dir).resolve()
        if not self.log_dir.exists():  # made here: jobs of other accounts enter it (to their run directory), not list it
            self.log_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.log_dir, launcher.JOB_DIR_MODE)
        self.block_s = block_s
        self.cancel_grace_s = cancel_grace_s
        self.kill_on_exit = kill_on_exit
        self.verify_fence = verify_fence
        self.extra_env = jobenv.check_extra_env(extra_env or {})
        self.pass_env = jobenv.check_pass_env(pass_env)
        self.job_user: JobUser | None = resolve_user(run_as) if run_as else None
        # --user-map: each Frenzy user's jobs as their own account (usermap.py); None: all as job_user.
        self.user_map = (UserMap(os.fspath(user_map), min_job_uid, unmapped, self.job_user)
                         if user_map else None)
        # A cgroup per job (cgroups.py), where the host allows it; what it allows is said once here.
        self.cgroups = JobCgroups.setup(cgroup_root, node, job_memory_max, job_pids_max)
        (log.info if self.cgroups.enabled and not self.cgroups.why_not else log.warning)(
            "node %s: %s", node, self.cgroups.describe())
        self.workdir_roots = jobenv.workdir_roots(workdir_roots, self.job_user)
        # Every attempt of a job gets ROOT/<job id> (FRENZY_CHECKPOINT_DIR): "" when not given.
        self.checkpoint_root = jobenv.check_checkpoint_root(os.fspath(checkpoint_root)) if checkpoint_root else ""
        self.instance = uuid.uuid4().hex  # lease value: tells this agent run from any other
        self.ready = threading.Event()  # set once registered and past the pending entries (tests wait on it)

        # RESP2 pinned: the stream-reply parsing below relies on its shape. Timeouts from the heartbeat
        # and the launch stream's block: behind a silent partition a call fails within seconds (connect.py).
        self.timeouts = agent_timeouts(heartbeat_s, ttl_s, block_s)
        self._redis = connect.client(redis_url, self.timeouts, decode_responses=True, protocol=2)
        self._node_record = NodeRegistration(self._redis, self.keys, node, addr, ttl_s, self.instance,
                                             price_per_gpu_hour)  # (EVALSHA only: issue 34)
        self._logs = LogShipper(self._redis, self.keys, node, poll_s=log_poll_s, maxlen=log_stream_maxlen,
                                retention_s=log_retention_s)
        state = Path(state_dir).resolve() if state_dir else self.log_dir / ".agent"
        if not state.exists():  # the ledger (0700) and code cache (0700) are in it; jobs' workdirs too (entered)
            state.mkdir(parents=True, exist_ok=True)
            os.chmod(state, launcher.JOB_DIR_MODE)
        self._ledger = Ledger(state / f"{node}.json")
        # (stream, entry id, consuming thread) of the launch being handled: its first event acks it.
        self._ack_with_event: tuple[str, str, int] | None = None
        # Forks each job's shim (frenzy.agent.spawner); use_spawner=False execs it instead.
        self._spawner: Spawner | bool = Spawner() if use_spawner else False
        # Jobs' packed code: read as bytes (a second client, the first decodes replies), unpacked
        # under the state directory (frenzy.agent.codecache).
        self._code_redis = connect.client(redis_url, self.timeouts, decode_responses=False, protocol=2)
        self._code = CodeCache(state, CodeReader(self._code_redis, self.keys))
        self.cache_policy = cache_policy or CachePolicy()
        self._pruned_at = float("-inf")  # monotonic time of the last prune (the heartbeat thread's)
        # Monotonic time of the last heartbeat Redis took: the fence watchdog measures silence from it.
        self._beat_ok_at = time.monotonic()
        self._gpus: list[GpuInfo] = []
        self._jobs: dict[tuple[str, int], JobProcess] = {}
        self._lock = threading.Lock()
        self._detached = threading.Event()  # set on stop: this run no longer reports anything
        self._threads: list[threading.Thread] = []
        self._seal = NodeSeal(self._redis, self.keys, node)  # this node's keys: launch seals, event seals
        # Prometheus (frenzy.agent.metrics): the CLI serves metrics.registry with --metrics-address.
        self.metrics = AgentMetrics(node)
        self.metrics.watch(lambda: self._gpus, lambda: len(self._jobs))

    # ------------------------------------------------------------ lifecycle

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set. Raises GpuDiscoveryError if the GPUs cannot be read."""
        self._gpus = self.backend.discover()
        hb_stop = threading.Event()
        hb = threading.Thread(target=self._heartbeat_loop, args=(hb_stop,), name=f"heartbeat-{self.node}",
                              daemon=True)
        ship = threading.Thread(target=self._logs.run, args=(hb_stop,), name=f"logs-{self.node}", daemon=True)
        # Apart from the heartbeat, which a silent partition can hold in one Redis call for long.
        fence = threading.Thread(target=self._fence_watchdog, args=(hb_stop,), name=f"fence-{self.node}",
                                 daemon=True)
        try:
            if not self._until_done(stop, self._seal.read, "read the node key"):
                return
            if self._seal.ring is None:
                raise NodeKeyMissing(self.node)
            if not self._until_done(stop, self._register, "register"):
                return
            if not self._until_done(stop, self._adopt, "adopt jobs of a previous run"):
                return
            self._beat_ok_at = time.monotonic()
            hb.start()
            ship.start()
            fence.start()
            self._consume(stop)
        finally:
            self._shutdown()
            hb_stop.set()
            for t in (hb, ship, fence):
                if t.is_alive():
                    t.join(timeout=5)
            self.backend.close()
            if not isinstance(self._spawner, bool):
                self._spawner.close()  # (running shims carry on without it)
            self._redis.close()
            self._code_redis.close()
            log.info("agent %s stopped", self.node)

    def _shutdown(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        if self.kill_on_exit and jobs:
            log.info("--kill-on-exit: stopping %d job(s)", len(jobs))
            for job in jobs:
                job.killed_on_exit = True
                self._signal_job(job, signal.SIGTERM)
            deadline = time.monotonic() + self.cancel_grace_s
            for job in jobs:
                if not job.exited.wait(max(0.0, deadline - time.monotonic())):
                    self._signal_job(job, signal.SIGKILL)
            for t in self._threads:  # let the watchers report the exits
                t.join(timeout=max(1.0, deadline - time.monotonic()))
        elif jobs:
            log.info("leaving %d job(s) running; a restarted agent adopts them", len(jobs))
        # From here on this run is gone: its watchers stay quiet and a restarted
        # agent (reading the ledger) takes over reporting.
        self._detached.set()

    def _until_done(self, stop: threading.Event, action: Callable[[], None], what: str) -> bool:
        """Run ``action`` until it succeeds, riding out Redis outages; False if stopped first."""
        failures = 0
        while not stop.is_set():
            try:
                action()
                if failures:
                    log.info("%s: Redis is back", what)
                return True
            except (redis.ConnectionError, redis.TimeoutError, scripts.ScriptNotLoaded) as exc:
                why = exc if isinstance(exc, scripts.ScriptNotLoaded) else f"Redis unreachable ({exc})"
                (log.warning if (failures := failures + 1) == 1 else log.debug)("%s: %s; retrying", what, why)
                stop.wait(_RETRY_S)
        return False

    # ------------------------------------------------------------ registration and heartbeat

    def _register(self) -> None:
        self._node_record.register(self._gpus)

    def _heartbeat_once(self) -> None:
        show = getattr(self.backend, "show_usage", None)
        if show is not None:  # fake GPUs: the running jobs' predicted memory, as NVML would show it
            with self._lock:
                usage = {i: j.peak_bytes_per_gpu for j in self._jobs.values() if not j.exited.is_set()
                         for i in j.gpu_indices}
            show(usage)
        try:
            self._gpus = self.backend.refresh(self._gpus)
            self._sample_peaks()
        except Exception:  # a flaky driver must not stop the lease; report the last known state
            log.exception("refreshing GPU state failed; sending the last known values")
        renewed = self._node_record.heartbeat(self._gpus)
        if renewed == MISSING:
            log.warning("node %s is missing from Redis (data lost or node deleted); registering again",
                        self.node)
            self._register()
        elif renewed == DECLARED_DEAD:
            self._stop_moved_jobs()

    def _sample_peaks(self) -> None:
        """Keep each running job's highest GPU memory so far (real GPUs: fake ones show MARP's
        prediction, which says nothing about the job; there the job declares its peak)."""
        if not isinstance(self.backend, NvmlBackend):
            return
        with self._lock:
            jobs = [j for j in self._jobs.values() if not j.exited.is_set() and j.gpu_indices]
        for job in jobs:
            pids = set(launcher.find_processes(job.launch_id)) if job.launch_id else {job.pid}
            held, total = job_gpu_bytes(self._gpus, job.gpu_indices, pids)
            if held > job.peak_seen:
                job.peak_seen, job.peak_gpu_total = held, total

    def _stop_moved_jobs(self) -> None:
        """The scheduler declared this node dead while it was cut off, freed its GPUs and requeued
        every job it ran: those jobs now run (or will) elsewhere, so the copies here must stop —
        a job never runs in two places (issue 14, D5). Their exits are reported as usual; the
        scheduler drops them as stale (an attempt it has moved past)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if not j.exited.is_set() and not j.cancelled]
        # A copy that ended on its own while this agent was cut off (its exit not yet seen by the
        # watcher thread, thawed at the same moment) is not stopped: its real exit is reported, and
        # an exit 0 may still be the job's result (the scheduler's late-success path).
        jobs = [j for j in jobs if not ended(j)]
        if not jobs:
            log.warning("node %s had been declared dead; no job of it runs here", self.node)
            return
        log.warning("node %s had been declared dead and its jobs moved; stopping %d job(s) here: %s", self.node,
                    len(jobs), ", ".join(f"{j.job_id}/{j.attempt}" for j in jobs))
        for job in jobs:
            self._stop(job)

    def prune(self) -> PruneReport:
        """Remove old or surplus code trees and the working directories of attempts not running here
        (``CodeCache.prune``, by ``cache_policy``)."""
        self._pruned_at = time.monotonic()
        with self._lock:
            running = set(self._jobs)
        return self._code.prune(self.node, running, self.cache_policy, log_dir=self.log_dir)

    def _prune_quietly(self) -> None:
        try:
            self.prune()
        except Exception:  # a disk problem is logged; the agent goes on
            log.exception("pruning the code cache failed")

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        failing = False
        while not stop.wait(self.heartbeat_s):
            try:
                sent = time.monotonic()
                self._heartbeat_once()
                self._beat_ok_at = sent  # not the reply's time: a lossy link delays it (fencing.py)
                self._seal.read()
                if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
                    # In a thread of its own: deleting big trees must not delay the next heartbeat.
                    self._pruned_at = time.monotonic()
                    threading.Thread(target=self._prune_quietly, name=f"prune-{self.node}", daemon=True).start()
                if failing:
                    log.info("heartbeat: Redis is back")
                failing = False
            except redis.RedisError as exc:
                (log.debug if failing else log.warning)("heartbeat failed: %s", exc)
                failing = True
                if redis_is_down(exc):  # down for everyone: nobody counts this silence (reaping.py)
                    self._beat_ok_at = sent
            except Exception:  # keep the lease alive whatever else breaks; a dead thread kills the node
                log.exception("heartbeat failed unexpectedly")

    def _fence_watchdog(self, stop: threading.Event) -> None:
        while not stop.wait(min(self.heartbeat_s, 1.0)):
            try:
                self._fence_if_cut_off(time.monotonic())
            except Exception:  # the watchdog outlives any one failure
                log.exception("fence watchdog failed")

    def _fence_if_cut_off(self, now: float) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        silent = now - self._beat_ok_at
        for job in to_fence(jobs, silent, self.cancel_grace_s, self.heartbeat_s, self.ttl_s):
            job.fenced = not ended(job)  # (one that ended while cut off or frozen is reported as it ended)
            if not job.fenced:
                continue
            log.warning("job %s attempt %d: no heartbeat reached Redis for %.1fs (its rerun elsewhere comes at "
                        "%.1fs); stopping it here", *job.key, silent, job.node_dead_after_s, extra=self._context(*job.key))
            self._stop(job, min(self.cancel_grace_s, max(job.node_dead_after_s - silent - self.heartbeat_s, 0.0)))

    # ------------------------------------------------------------ the launch stream

    def _consume(self, stop: threading.Event) -> None:
        stream = self.keys.launch_stream(self.node)
        need_pending = True  # on start and after any Redis error: first re-read our unacked entries
        while not stop.is_set():
            try:
                if need_pending:
                    ensure_group(self._redis, stream, AGENT_GROUP)
                    self._process_pending(stream, stop)
                    self._announce_all()
                    need_pending = False
                    self.ready.set()
                reply = self._redis.xreadgroup(AGENT_GROUP, self.node, {stream: ">"}, count=16,
                                               block=max(1, int(self.block_s * 1000)))
                for entry_id, fields in xreadgroup_entries(reply):
                    if stop.is_set():
                        break  # unacked: the next agent run gets it from the pending list
                    self._handle(stream, entry_id, fields)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("launch stream: Redis unreachable (%s); retrying", exc)
                need_pending = True
                stop.wait(_RETRY_S)
            except redis.ResponseError as exc:
                # NOGROUP: the stream or group was deleted under us; recreate and go on.
                log.warning("launch stream: %s; recreating the consumer group", exc)
                need_pending = True
                stop.wait(min(_RETRY_S, self.block_s))

    def _process_pending(self, stream: str, stop: threading.Event) -> None:
        """Entries delivered to this consumer before a crash or outage and never acknowledged."""
        last = "0"
        while not stop.is_set():
            entries = xreadgroup_entries(self._redis.xreadgroup(AGENT_GROUP, self.node, {stream: last}, count=64))
            if not entries:
                return
            for entry_id, fields in entries:
                log.info("re-processing pending launch-stream entry %s", entry_id)
                self._handle(stream, entry_id, fields, redelivered=True)
                last = entry_id

    def _handle(self, stream: str, entry_id: str, fields: dict | None, redelivered: bool = False) -> None:
        """Act on one entry, then acknowledge it. Redis errors propagate (no ack: it is redelivered).

        ``redelivered``: the entry was read before (by a run that crashed): its
        process may already exist even though the ledger does not know it."""
        if not fields:
            log.warning("launch stream %s: entry %s was deleted before it was read; skipping it",
                        stream, entry_id)
        else:
            obj: dict | None = None
            refusal: Refusal | None = None
            try:
                obj = payload(fields)
                refusal = self._seal.check(obj, entry_id)
                cmd = command_from(obj) if refusal is None else None
            except BadMessage as exc:
                log.warning("launch stream %s: skipping bad entry %s: %s", stream, entry_id, exc)
                if obj is not None and self._answer_unusable(stream, entry_id, obj, None, str(exc)):
                    return
            else:
                if refusal is not None:
                    self._refuse(obj, entry_id, refusal)
                    if self._answer_unusable(stream, entry_id, obj, refusal, refusal.value):
                        return
                elif isinstance(cmd, LaunchMessage):
                    # The launch's RUNNING event carries the acknowledgement (one round trip,
                    # still after the process started); any other outcome acks below.
                    self._ack_with_event = (stream, entry_id, threading.get_ident())
                    try:
                        self._launch(cmd, entry_id, redelivered)
                    finally:
                        acked = self._ack_with_event is None
                        self._ack_with_event = None
                    if acked:
                        return
                elif isinstance(cmd, CancelMessage):
                    self._cancel(cmd)
        self._redis.xack(stream, AGENT_GROUP, entry_id)

    def _answer_unusable(self, stream: str, entry_id: str, obj: dict, refusal: Refusal | None,
                         problem: str) -> bool:
        """Report a launch the scheduler sealed for this node that is not acted on (expired, or unreadable
        by this agent) as LAUNCH_FAILED, so its job is requeued now rather than left LAUNCHING; nothing for
        an entry the scheduler did not seal (``launch_check.report_unusable`` says which). The event
        acknowledges the entry. -> whether it was sent."""
        with self._lock:
            running = list(self._jobs)
        report = report_unusable(obj, refusal, problem, self.node, running)
        if report is None:
            return False
        log.warning("node %s: telling the scheduler that launch %s of job %s attempt %d is not run here: %s",
                    self.node, entry_id, report.job_id, report.attempt, report.message,
                    extra=self._context(report.job_id, report.attempt))
        self._ack_with_event = (stream, entry_id, threading.get_ident())
        try:
            self._emit(self._event(EventKind.LAUNCH_FAILED, report.job_id, report.attempt, fence=report.fence,
                                   message=report.message, retryable=report.retryable))
        finally:
            acked = self._ack_with_event is None
            self._ack_with_event = None
        return acked

    def _refuse(self, obj: dict, entry_id: str, refusal: Refusal) -> None:
        """An entry not signed for this node: nothing of it is acted on; logged and counted."""
        log.warning("node %s: refusing %s %s for job %s: %s", self.node, str(obj.get("kind", "entry"))[:32],
                    entry_id, str(obj.get("job_id"))[:128], refusal.value,
                    extra={"node": self.node, "job_id": str(obj.get("job_id"))[:128], "entry": entry_id})
        self.metrics.refused.labels(self.node, refusal_label(refusal)).inc()
        self._redis.hincrby(self.keys.node(self.node), "refused_launches", 1)

    # ------------------------------------------------------------ launch

    def launch_id(self, job_id: str, attempt: int) -> str:
        """The id every process of this launch carries in ``FRENZY_LAUNCH_ID``."""
        return f"{self.keys.prefix}/{self.node}/{job_id}/{attempt}"

    def _launch(self, msg: LaunchMessage, entry_id: str, redelivered: bool = False) -> None:
        with self._lock:
            existing = self._jobs.get((msg.job_id, msg.attempt))
        if existing is None and redelivered:
            existing = self._find_orphan(msg)
        if existing is not None:
            log.info("job %s attempt %d already runs here (pid %d); ignoring the repeated launch %s",
                     msg.job_id, msg.attempt, existing.pid, entry_id, extra=self._context(msg.job_id, msg.attempt))
            self.metrics.launch("already_running")
            self._announce(existing)  # in case the first delivery died before reporting RUNNING
            return
        failed = self._event(EventKind.LAUNCH_FAILED, msg.job_id, msg.attempt, fence=msg.fence)
        try:
            verdict = self._check_launch(msg)
            if not verdict.ok:
                log.warning("refusing launch %s of job %s attempt %d: %s", entry_id, msg.job_id,
                            msg.attempt, verdict.problem, extra=self._context(msg.job_id, msg.attempt))
                self.metrics.launch("refused")
                self._emit(failed.model_copy(update={"message": verdict.problem, "retryable": verdict.retryable}))
                return
            user = self._user_for(msg)
            if msg.code_sha256:
                msg = self._with_code(msg, user)
            try:
                cgroup = self.cgroups.create(msg.job_id, msg.attempt)
            except OSError as exc:
                raise launcher.LaunchError(f"cannot make the job's cgroup on node {self.node}: "
                                           f"{exc.strerror or exc}", retryable=True) from None
            try:
                started = launcher.start(msg, self.node, self.log_dir,
                                         launch_id=self.launch_id(msg.job_id, msg.attempt),
                                         extra_env=self.extra_env, pass_env=self.pass_env, user=user,
                                         checkpoint_root=self.checkpoint_root, spawner=self._spawner, cgroup=cgroup)
            except BaseException:
                cgroups.remove(cgroup)
                raise
        except launcher.LaunchError as exc:
            log.warning("job %s attempt %d could not start: %s", msg.job_id, msg.attempt, exc,
                        extra=self._context(msg.job_id, msg.attempt))
            self.metrics.launch("failed")
            try:
                path: str | None = str(launcher.log_path_for(self.log_dir, msg, self.node))
            except launcher.LaunchError:
                path = None  # the log path itself was the problem: nothing was written
            self._emit(failed.model_copy(update={"message": str(exc), "log_path": path, "retryable": exc.retryable}))
            if path is not None:
                self._ship_once(msg.job_id, msg.attempt, path)
            return
        except redis.RedisError:
            raise
        except Exception as exc:  # a bug here must fail the launch visibly, not wedge the stream
            log.exception("launch of job %s attempt %d failed unexpectedly", msg.job_id, msg.attempt,
                          extra=self._context(msg.job_id, msg.attempt))
            self.metrics.launch("error")
            # The agent's fault, not the job's: another node may run it.
            self._emit(failed.model_copy(update={"message": f"agent error on node {self.node}: "
                                                 f"{type(exc).__name__}: {exc}", "retryable": True}))
            return
        ticks = getattr(started.proc, "start_ticks", None)  # (the spawner read it already)
        job = JobProcess(msg.job_id, msg.attempt, started.proc.pid, str(started.log_path),
                         ticks if ticks is not None else launcher.process_start_ticks(started.proc.pid),
                         fence=msg.fence,
                         launch_id=self.launch_id(msg.job_id, msg.attempt), node_rank=msg.node_rank,
                         proc=started.proc, gpu_indices=tuple(msg.gpu_indices),
                         peak_bytes_per_gpu=msg.layout.peak_bytes_per_gpu, new_log=started.log_start == 0,
                         node_dead_after_s=msg.node_dead_after_s)
        with self._lock:
            self._jobs[job.key] = job
        # Recorded in the ledger by _announce, once RUNNING is out: until the launch entry is
        # acknowledged (after that), a crash redelivers it and _find_orphan finds this process
        # by its pid file or marker, so a write here (one of three per job) bought nothing.
        log.info("job %s attempt %d started: pid %d, GPUs %s, log %s", msg.job_id, msg.attempt, job.pid,
                 msg.gpu_indices, job.log_path, extra=self._context(msg.job_id, msg.attempt))
        self.metrics.launch("started")
        self._announce(job)

    def _user_for(self, msg: LaunchMessage) -> JobUser | None:
        """The account ``msg``'s job runs as here (None: the agent's own); LaunchError when its user has
        none (``--user-map`` without a line for them, and unmapped users refused)."""
        if self.user_map is None:
            return self.job_user
        try:
            return self.user_map.user_for(msg.user, self.node)
        except UnmappedUser as exc:
            raise launcher.LaunchError(str(exc)) from None

    def _with_code(self, msg: LaunchMessage, user: JobUser | None = None) -> LaunchMessage:
        """``msg`` running in a fresh copy of its packed code (fetched, checked and unpacked once per
        hash). LaunchError when the code cannot be had; Redis errors propagate (the entry is retried)."""
        assert msg.code_sha256 is not None
        try:
            workdir = self._code.workdir(msg.code_sha256, msg.job_id, msg.attempt, self.node, user)
        except CodeUnavailable as exc:
            problem = f"the job's code could not be unpacked on node {self.node}: {exc}"
            # In the job's log too (shipped by the failure path): `frenzy logs` and `frenzy job` show why.
            append_line(launcher.log_path_for(self.log_dir, msg, self.node),
                         f"# frenzy agent {self.node}: job {msg.job_id} attempt {msg.attempt}: launch failed: {problem}")
            raise launcher.LaunchError(problem) from exc
        return msg.model_copy(update={"workdir": str(workdir)})

    def _find_orphan(self, msg: LaunchMessage) -> JobProcess | None:
        """The process a crashed agent run started for ``msg`` before it could record it, if any."""
        launch_id = self.launch_id(msg.job_id, msg.attempt)
        log_path = launcher.log_path_for(self.log_dir, msg, self.node)
        spawned = launcher.spawned_pid(log_path)  # a shim the spawner forked says so in a file
        shims = [spawned] if spawned is not None else launcher.find_processes(launch_id, shim_only=True)
        if not shims:
            return None
        pid = shims[0]
        log.warning("job %s attempt %d: found its process %d started by a previous agent run that crashed "
                    "before recording it; adopting it instead of starting it again", msg.job_id, msg.attempt, pid)
        job = JobProcess(msg.job_id, msg.attempt, pid, str(log_path),
                         launcher.process_start_ticks(pid), fence=msg.fence, launch_id=launch_id,
                         node_rank=msg.node_rank, gpu_indices=tuple(msg.gpu_indices),
                         peak_bytes_per_gpu=msg.layout.peak_bytes_per_gpu, node_dead_after_s=msg.node_dead_after_s)
        with self._lock:
            self._jobs[job.key] = job
        self._ledger.put(job.ledger_entry())
        return job

    def _check_launch(self, msg: LaunchMessage) -> LaunchVerdict:
        """Gather what ``launch_check.check_launch`` judges the launch on, and judge it."""
        facts = LaunchFacts(
            node=self.node, gpu_uuids={g.index: g.uuid for g in self._gpus},
            port_busy=opens_rendezvous(msg) and launcher.port_in_use(msg.master_port),
            holders=self._gpu_holders(msg.gpu_indices) if self.verify_fence else None,
            workdir=launcher.resolved_workdir(msg), workdir_roots=self.workdir_roots,
            silent_s=time.monotonic() - self._beat_ok_at,
            fence_after_s=fence_deadline_s(msg.node_dead_after_s, self.cancel_grace_s, self.heartbeat_s, self.ttl_s),
        )
        return check_launch(msg, facts)

    def _gpu_holders(self, indices: list[int]) -> dict[int, GpuHolder]:
        """Owner and fence of this node's GPUs ``indices`` as Redis has them, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for i in indices:
            pipe.hmget(self.keys.gpu(self.node, i), "owner", "fence")
        return {i: GpuHolder(owner, fence) for i, (owner, fence) in zip(indices, pipe.execute(), strict=True)}

    def _announce(self, job: JobProcess) -> None:
        """Report RUNNING once, then start watching the process."""
        if not job.reported:
            self._emit(self._event(EventKind.RUNNING, job.job_id, job.attempt, fence=job.fence, pid=job.pid,
                                   log_path=job.log_path))
            job.reported = True
            self._ledger.put(job.ledger_entry())
        self._logs.watch(job.job_id, job.attempt, job.log_path, new_file=job.new_log)
        if not job.watching:
            job.watching = True
            target = self._watch_child if job.proc is not None else self._watch_adopted
            t = threading.Thread(target=target, args=(job,), name=f"watch-{job.job_id}-{job.attempt}",
                                 daemon=True)
            self._threads.append(t)
            t.start()

    def _announce_all(self) -> None:
        # Adopted jobs whose launch entry was already acknowledged need a watcher too.
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self._announce(job)

    # ------------------------------------------------------------ exit watching

    def _watch_child(self, job: JobProcess) -> None:
        proc = job.proc
        if isinstance(proc, launcher.SpawnedShim):
            self._watch_spawned(job, proc)
            return
        try:
            # Wait without reaping, so the pid (= group id) cannot be reused while
            # we clean up what a cancelled job left behind in its group.
            os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        job.exited.set()  # before reaping: the SIGKILL escalation must not fire at a reused pid
        # The job's leader is gone: whatever is left of it (in its group, or in
        # sessions of its own like torchrun's workers) is a straggler.
        self._signal_job(job, signal.SIGKILL, quiet=True)
        code = proc.wait()  # type: ignore[union-attr]
        self._finish(job, code, "")

    def _watch_spawned(self, job: JobProcess, shim: launcher.SpawnedShim) -> None:
        # The spawner is the shim's parent and reaps it; we see its end through a pidfd.
        while not shim.wait_gone(1.0):
            if self._detached.is_set():
                return
        job.exited.set()
        code = shim.wait()
        if not shim.clean:  # the shim could not vouch that nothing of the job is left: search
            self._signal_job(job, signal.SIGKILL, quiet=True)
        self._finish(job, code, "" if code is not None else "exit code unknown: the job's shim left no status")

    def _watch_adopted(self, job: JobProcess) -> None:
        # Not our child (a previous agent run started it): we can only poll, and
        # the exit status went to whoever reaped it.
        poll = min(1.0, self.block_s)
        while launcher.process_running(job.pid, job.start_ticks):
            if self._detached.wait(poll):
                return
        job.exited.set()
        self._signal_job(job, signal.SIGKILL, quiet=True)
        # The shim (the process's parent, not us) recorded how it ended.
        code = launcher.read_exit_status(job.log_path)
        self._finish(job, code, "" if code is not None else
                     "exit code unknown: the process was started by a previous agent run and left no status")

    def _finish(self, job: JobProcess, code: int | None, message: str) -> None:
        if self._detached.is_set():
            return  # this agent run has stopped; the next one reports from the ledger
        if job.killed_on_exit:
            message = message or "killed because the agent stopped (--kill-on-exit)"
        self._clean_up(job.job_id, job.attempt, job.log_path)
        append_trailer(job.log_path, code, job.cancelled)
        log.info("job %s attempt %d exited: code %s%s", job.job_id, job.attempt, code,
                 " (cancelled)" if job.cancelled else "", extra=self._context(job.job_id, job.attempt))
        event = self._event(EventKind.EXITED, job.job_id, job.attempt, fence=job.fence, pid=job.pid,
                            exit_code=code, cancelled=job.cancelled, log_path=job.log_path, message=message,
                            **exit_report(job.log_path, code, job.cancelled, job.peak_seen, job.peak_gpu_total,
                                                fenced=job.fenced))
        while not self._detached.is_set():
            try:
                # All output first: once every node reported, the job's log stream is complete.
                self._logs.finish(job.job_id, job.attempt)
                self._emit(event)
                break
            except redis.RedisError as exc:
                log.warning("could not report the exit of job %s (%s); retrying", job.job_id, exc)
                self._detached.wait(_RETRY_S)
        else:
            return  # stopped while Redis was down: keep the ledger entry for the next run
        with self._lock:
            self._jobs.pop(job.key, None)
        self._ledger.remove(job.job_id, job.attempt)

    def _clean_up(self, job_id: str, attempt: int, log_path: str) -> None:
        """What an ended job leaves that nobody needs: its cgroup (and whatever still ran in it, which no
        signal to its group or search of /proc found) and its private tmp."""
        cgroups.remove(self.cgroups.path_for(job_id, attempt))
        tmp = launcher.run_dir_for(log_path) / launcher.TMP_DIR
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)  # (fd-based: a link the job left inside is not followed)

    # ------------------------------------------------------------ cancel

    def _cancel(self, msg: CancelMessage) -> None:
        with self._lock:
            job = self._jobs.get((msg.job_id, msg.attempt))
        if job is None:
            log.info("cancel for job %s attempt %d: not running here; nothing to do", msg.job_id, msg.attempt)
            return
        if job.cancelled:
            log.info("cancel for job %s attempt %d: already stopping", msg.job_id, msg.attempt)
            return
        log.info("cancelling job %s attempt %d (pid %d)%s: SIGTERM, SIGKILL after %.1fs", msg.job_id,
                 msg.attempt, job.pid, f" because {msg.reason}" if msg.reason else "", self.cancel_grace_s,
                 extra=self._context(msg.job_id, msg.attempt))
        self._stop(job)

    def _stop(self, job: JobProcess, grace_s: float | None = None) -> None:
        """SIGTERM to the job now, SIGKILL after ``grace_s`` (default ``cancel_grace_s``) if it is
        still there."""
        job.cancelled = True
        self._signal_job(job, signal.SIGTERM)
        grace = self.cancel_grace_s if grace_s is None else grace_s
        threading.Thread(target=self._escalate, args=(job, grace), name=f"kill-{job.job_id}", daemon=True).start()

    def _escalate(self, job: JobProcess, grace_s: float) -> None:
        if not job.exited.wait(grace_s):
            log.warning("job %s attempt %d ignored SIGTERM for %.1fs; sending SIGKILL", job.job_id,
                        job.attempt, grace_s)
            self._signal_job(job, signal.SIGKILL)

    def _signal_job(self, job: JobProcess, sig: int, quiet: bool = False) -> None:
        """``sig`` to the job's process group and to its processes that left it (other sessions)."""
        # The group id is the leader's pid: signal the group only while that pid is
        # surely still ours (our child not yet reaped, or an adopted leader with the
        # same start time), never a reused pid. What remains is found by launch id.
        if isinstance(job.proc, subprocess.Popen):
            ours = job.proc.returncode is None
        else:
            ours = launcher.process_running(job.pid, job.start_ticks)
        if ours:
            launcher.signal_group(job.pid, sig)
        if sig == signal.SIGKILL:  # everything in the job's cgroup, found or not (cgroups.py)
            cgroups.kill(self.cgroups.path_for(job.job_id, job.attempt))
        others = launcher.kill_launch(job.launch_id, sig)
        if others and not quiet:
            log.info("job %s attempt %d: %s also sent to %d process(es) outside its group", job.job_id,
                     job.attempt, signal.Signals(sig).name, len(others))
        elif others:
            log.info("job %s attempt %d: killed %d straggler process(es) left after it ended", job.job_id,
                     job.attempt, len(others))

    # ------------------------------------------------------------ adoption after a restart

    def _adopt(self) -> None:
        for entry in self._ledger.load():
            job = JobProcess(entry.job_id, entry.attempt, entry.pid, entry.log_path, entry.start_ticks,
                             fence=entry.fence, launch_id=entry.launch_id, node_rank=entry.node_rank,
                             reported=entry.reported, gpu_indices=entry.gpu_indices,
                             peak_bytes_per_gpu=entry.peak_bytes_per_gpu, node_dead_after_s=entry.node_dead_after_s)
            if launcher.process_running(entry.pid, entry.start_ticks):
                log.info("adopting job %s attempt %d (pid %d) from a previous agent run", entry.job_id,
                         entry.attempt, entry.pid)
                with self._lock:
                    self._jobs[job.key] = job
            else:
                code = launcher.read_exit_status(entry.log_path)
                log.info("job %s attempt %d (pid %d) ended while the agent was down: exit code %s",
                         entry.job_id, entry.attempt, entry.pid, code if code is not None else "unknown")
                self._signal_job(job, signal.SIGKILL, quiet=True)
                self._clean_up(entry.job_id, entry.attempt, entry.log_path)
                self._ship_once(entry.job_id, entry.attempt, entry.log_path)
                self._emit(self._event(
                    EventKind.EXITED, entry.job_id, entry.attempt, fence=entry.fence, pid=entry.pid,
                    exit_code=code, log_path=entry.log_path,
                    message="the process ended while the agent was not running"
                    + ("" if code is not None else "; it left no exit status"),
                    **exit_report(entry.log_path, code, False)))
                self._ledger.remove(entry.job_id, entry.attempt)

    def _ship_once(self, job_id: str, attempt: int, path: str) -> None:
        """Ship what a finished (or never started) job's log holds; a failure only costs the stream copy."""
        try:
            self._logs.watch(job_id, attempt, path)
            self._logs.finish(job_id, attempt)
        except redis.RedisError as exc:
            log.warning("could not ship the log of job %s attempt %d: %s", job_id, attempt, exc)
            self._logs.forget(job_id, attempt)

    # ------------------------------------------------------------ events

    def _event(self, kind: EventKind, job_id: str, attempt: int, **fields) -> AgentEvent:
        return AgentEvent(kind=kind, job_id=job_id, attempt=attempt, node=self.node, **fields)

    def _emit(self, event: AgentEvent) -> None:
        """Send ``event``, sealed now with this node's key (``NodeSeal.seal``)."""
        data = self._seal.seal(event)
        ack = self._ack_with_event
        if ack is not None and ack[2] == threading.get_ident():
            pipe = self._redis.pipeline(transaction=False)
            pipe.xadd(self.keys.events_stream(), data)
            pipe.xack(ack[0], AGENT_GROUP, ack[1])
            pipe.execute()
            self._ack_with_event = None
        else:
            self._redis.xadd(self.keys.events_stream(), data)
        self.metrics.events.labels(self.node, event.kind.value).inc()

    def _context(self, job_id: str, attempt: int) -> dict[str, object]:
        """The fields a structured log line (``--log-format json``) carries for one job attempt here."""
        return {"job_id": job_id, "attempt": attempt, "node": self.node}

    # ------------------------------------------------------------ introspection (tests, tools)

    def running_jobs(self) -> list[JobProcess]:
        with self._lock:
            return [replace(j) for j in self._jobs.values()]

    @property
    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)
