"""Every Redis key Frenzy uses, in one place.

State lives under one prefix so several stacks (or test runs) can share a
server by choosing a different prefix. Nothing else in the code base builds a
key string by hand: it calls one of the functions here, so the layout below is
the whole truth about what is in Redis.

    {p}:node:{node}              hash   node record (addr, gpu count, gpu types, registered_at, heartbeat_at,
                                        draining, health_reason, dead_at: set when the scheduler declared it dead,
                                        rev: bumped by every script that changes what the scheduler reads of the
                                        node's GPUs — owner, health, a free GPU's memory_free — so it re-reads
                                        only nodes whose rev moved; a direct HSET on a GPU hash must bump it too)
    {p}:node:{node}:alive        string heartbeat lease, expires after the heartbeat TTL
    {p}:node:{node}:key          hash   the node's signing key (state/signing.py): current, previous (hex, 32 bytes),
                                        rotated_at; made by `frenzy node key create|rotate`, read by the node's agent
                                        and the scheduler only
    {p}:nodes                    set    names of every node that ever registered
    {p}:gpu:{node}:{index}       hash   one GPU: uuid, type, memory_total, memory_free, owner (job id or ""), fence,
                                        pci_bus_id, links (JSON), utilization, processes (JSON), health_reason
    {p}:job:{job}                hash   job record: spec, plans, state, attempt, plan, placement, fence, reason,
                                        master_node/master_port, exit:{node}, log:{node}, pid:{node},
                                        failed_node/failed_rank/failed_exit_code, ...
    {p}:job:{job}:history        list   JSON state transitions, oldest first
    {p}:jobs                     zset   every job id, scored by submit time
    {p}:queue                    zset   PENDING job ids, scored by submit sequence (FIFO order)
    {p}:queue:hold               string set while an operator holds the queue (`frenzy queue hold`): its text is
                                        the reason; jobs are accepted and wait, none is placed until it is deleted
    {p}:scheduler:leader         string the leader lease: "epoch:holder", with a TTL the leader renews; only its
                                        holder places jobs and declares nodes dead (acquire_lease.lua)
    {p}:scheduler:epoch          string leader tenures so far (the epoch in the lease value)
    {p}:scheduler:wake           list   a token pushed to wake the leader's loop now (a release of the held queue,
                                        a submission taken by a standby); at most one element
    {p}:idem:{key}               string idempotency key -> job id (submission dedup)
    {p}:seq                      string monotonically increasing submit sequence / fencing token
    {p}:launch:{node}            stream launch and cancel commands for one node's agent
    {p}:ports:{node}             hash   rendezvous (master) ports in use on that node: port -> job id
    {p}:node:{node}:logs:{job}   stream one node's output of a job, every attempt, shipped by that node's agent only
                                        (append_log.lua; capped per node: FRENZY_LOG_MAX_BYTES); expires 7 days after
                                        its last output. Readers (StreamLogs, state/job_logs.py) merge the streams of
                                        the nodes the job was placed on, by entry id (time order). Under node:{node}
                                        so an agent's ACL pattern (~{p}:node:{node}:logs:*) reaches its own node's
                                        output and nothing else (issue 34)
    {p}:node:{node}:logs:{job}:offsets  hash "{node}/{attempt}" -> bytes of that node's log file already in its
                                        stream, and the cap's bookkeeping (":bytes", ":cap", ...: append_log.lua)
    {p}:logs:{job}, {p}:logs:{job}:offsets   the one stream of every node of a job from before issue 34: no longer
                                        written (agents may not), still read by StreamLogs until it expires
    {p}:events                   stream agent -> scheduler status events
    {p}:batch:{batch}            hash   batch submission outcomes: field per entry index -> JSON
                                        {"status", "job_id", "error", "name", "at"}; expires
                                        FRENZY_BATCH_TTL_S (7 days) after its last write
    {p}:batches                  zset   batch ids, scored by creation time (ids older than the TTL dropped)
    {p}:batch-queue              list   Celery's queue for batch submission tasks (kombu owns its
                                        format; kombu also keeps its own _kombu.* / unacked* keys)
    {p}:code:{sha256}            string a job's packed code (deterministic tar.gz, frenzy.code.pack), stored once per
                                        tree under the sha256 of its bytes (checked when it was uploaded);
                                        expires FRENZY_CODE_TTL_S (7 days) after its last use (HasCode, an
                                        upload, a submission naming it, the leader's renewal every TTL/8
                                        while a job naming it waits or runs); agents only read it (ACL)
    {p}:code-upload:{id}         string an upload in progress (Scheduler.UploadCode): its chunks appended; renamed
                                        to code:{sha256} once size and sha256 check, else deleted; expires
                                        after 10 minutes (an abandoned upload)
    {p}:usage                    stream what each ended attempt used (issue 35): one entry per GPU type of an attempt
                                        (job, user, attempt, name, gpu_type, gpus, price, start, end, gpu_hours,
                                        cost_usd, outcome), written with the attempt's end (lua/lib/usage_record.lua);
                                        trimmed by time (state/usage.py RETENTION_DAYS), never with the job
    {p}:usage:totals             hash   "h|{user}|{type}" GPU-hours and "usd|{user}|{type}" dollars ever charged
                                        (Prometheus' frenzy_gpu_hours_total / frenzy_dollars_total)
    {p}:usage:user:{user}        hash   "{day}|h", "{day}|usd": one user's charges per UTC day (days since 1970)
    {p}:usage:budgets            hash   user -> JSON {"gpu_hours", "usd", "period"}: a GPU-hour or dollar budget
                                        per period ("*": every user without one of their own; `frenzy budget`)
    {p}:token:{id}               hash   one API token: user, role, sha256 (of the secret, never the secret),
                                        created_at, expires_at (0: never), note
    {p}:tokens                   set    ids of every token
"""

from __future__ import annotations

import os

DEFAULT_PREFIX = "frenzy"

# Consumer groups: one per stream reader role.
AGENT_GROUP = "agent"
SCHEDULER_GROUP = "scheduler"


class Keys:
    """Key builder bound to one prefix (default ``$FRENZY_PREFIX`` or ``frenzy``)."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or os.environ.get("FRENZY_PREFIX", DEFAULT_PREFIX)

    # nodes and GPUs
    def node(self, node: str) -> str:
        return f"{self.prefix}:node:{node}"

    def node_alive(self, node: str) -> str:
        return f"{self.prefix}:node:{node}:alive"

    def node_key(self, node: str) -> str:
        return f"{self.prefix}:node:{node}:key"

    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def gpu(self, node: str, index: int) -> str:
        return f"{self.prefix}:gpu:{node}:{index}"

    # jobs
    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def job_history(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:history"

    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def queue(self) -> str:
        return f"{self.prefix}:queue"

    def queue_users(self) -> str:
        """user -> how many of their jobs are in the queue. The Lua scripts derive this name from
        the queue's key (lib/queue_users.lua): keep the two in step."""
        return f"{self.queue()}:users"

    def leader(self) -> str:
        return f"{self.prefix}:scheduler:leader"

    def leader_epoch(self) -> str:
        return f"{self.prefix}:scheduler:epoch"

    def wake(self) -> str:
        return f"{self.prefix}:scheduler:wake"

    def queue_hold(self) -> str:
        return f"{self.prefix}:queue:hold"

    def idempotency(self, key: str) -> str:
        return f"{self.prefix}:idem:{key}"

    def seq(self) -> str:
        return f"{self.prefix}:seq"

    # streams
    def launch_stream(self, node: str) -> str:
        return f"{self.prefix}:launch:{node}"

    def events_stream(self) -> str:
        return f"{self.prefix}:events"

    # torchrun rendezvous ports and job output
    def ports(self, node: str) -> str:
        return f"{self.prefix}:ports:{node}"

    def job_logs(self, job_id: str, node: str) -> str:
        """Node ``node``'s output of job ``job_id`` (only that node's agent writes it)."""
        return f"{self.prefix}:node:{node}:logs:{job_id}"

    def job_log_offsets(self, job_id: str, node: str) -> str:
        return f"{self.prefix}:node:{node}:logs:{job_id}:offsets"

    def legacy_job_logs(self, job_id: str) -> str:
        """A job's one log stream of every node, from before issue 34 (read, never written)."""
        return f"{self.prefix}:logs:{job_id}"

    def legacy_job_log_offsets(self, job_id: str) -> str:
        return f"{self.prefix}:logs:{job_id}:offsets"

    # batch submission (Celery worker, `frenzy batch`)
    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}"

    def batches(self) -> str:
        return f"{self.prefix}:batches"

    def batch_queue(self) -> str:
        return f"{self.prefix}:batch-queue"

    # code that travels with jobs (frenzy.state.code_store)
    def code(self, sha256: str) -> str:
        return f"{self.prefix}:code:{sha256}"

    def code_upload(self, upload_id: str) -> str:
        return f"{self.prefix}:code-upload:{upload_id}"

    # usage accounting (frenzy.state.usage). The Lua scripts derive these names from the job
    # hash's key (lib/usage_record.lua): keep the two in step.
    def usage_stream(self) -> str:
        return f"{self.prefix}:usage"

    def usage_totals(self) -> str:
        return f"{self.prefix}:usage:totals"

    def usage_user(self, user: str) -> str:
        return f"{self.prefix}:usage:user:{user}"

    def usage_budgets(self) -> str:
        return f"{self.prefix}:usage:budgets"

    # API tokens (frenzy.auth.tokens)
    def token(self, token_id: str) -> str:
        return f"{self.prefix}:token:{token_id}"

    def tokens(self) -> str:
        return f"{self.prefix}:tokens"
