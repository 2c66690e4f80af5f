"""The batch worker's Prometheus metrics (``frenzy worker --metrics-address``).

Counted where an entry's outcome is recorded (``app.process_entry``): entries by outcome
(submitted, duplicate, invalid, rejected, error, retrying, and ``already_done`` for a
redelivered task whose entry had already succeeded), and the time of each SubmitJob call.
No batch id, job id or user in a label.

One registry per process (the worker is one process per ``frenzy worker``): with ``--pool
threads`` or ``solo`` (the default is threads) every task runs in that process, so the endpoint
sees them all. With ``--pool prefork`` the tasks run in child processes and these counters stay
at zero in the parent: run more workers with ``threads`` instead.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from frenzy.worker import batch as B

OUTCOMES = (B.SUBMITTED, B.DUPLICATE, B.INVALID, B.REJECTED, B.ERROR, B.RETRYING, "already_done")
# Seconds: the scheduler answers a submission after one predictor call (or from its cache).
SUBMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.entries = Counter("frenzy_worker_entries", "Batch entries the worker finished a try of, by outcome.",
                               ["outcome"], registry=self.registry)
        self.submit_seconds = Histogram("frenzy_worker_submit_seconds", "One SubmitJob call to the scheduler, "
                                        "whatever its answer.", buckets=SUBMIT_BUCKETS, registry=self.registry)
        for outcome in OUTCOMES:
            self.entries.labels(outcome)


METRICS = WorkerMetrics()
