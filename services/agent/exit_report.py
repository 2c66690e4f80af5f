"""What an agent's EXITED event says beyond the exit code: the cause, the failure's last lines,
the peak memory per GPU.

The cause comes from ``exit_cause.classify`` over the end of the job's log; the peak is the
highest the agent measured (real GPUs) or what the job declared (``FRENZY_RUN_DIR/peak_bytes``),
whichever is higher. Both files are the job's to write, so they are read without blocking or
following links (``safefile``) and given up on after a few seconds: the exit is reported whatever
the job left behind (issue 34's FIFO trick).
"""

from __future__ import annotations

from frenzy.agent import launcher, safefile
from frenzy.agent.exit_cause import FENCED, classify, last_lines
from frenzy.state.messages import TAIL_BYTES, TAIL_LINES

# The most an exit report waits on one file of the job's (its log's end, its declared peak).
JOB_FILE_TIMEOUT_S = 5.0


def exit_report(log_path: str, code: int | None, cancelled: bool, peak_seen: int = 0,
                peak_gpu_total: int = 0, fenced: bool = False) -> dict[str, object]:
    """The EXITED event's fields beyond the code: ``cause``, ``tail`` (a failure's last lines),
    ``peak_bytes_per_gpu`` and ``peak_measured``. ``fenced``: the agent stopped the job itself
    (cut off from Redis), whatever its code says."""
    text = safefile.bounded(lambda: launcher.read_log_end(log_path), JOB_FILE_TIMEOUT_S, "", "log-end")
    declared = safefile.bounded(lambda: launcher.read_declared_peak(log_path), JOB_FILE_TIMEOUT_S, 0, "peak")
    share = peak_seen / peak_gpu_total if peak_seen and peak_gpu_total else None
    cause = FENCED if fenced else classify(code, text.splitlines(), cancelled=cancelled, peak_share=share,
                                           gpu_measured=peak_seen > 0)
    return {"cause": cause, "tail": last_lines(text, TAIL_LINES, TAIL_BYTES) if code != 0 else [],
            "peak_bytes_per_gpu": max(peak_seen, declared),
            "peak_measured": peak_seen > 0 and peak_seen >= declared}
