"""A command the shim cannot execute, though the agent's own checks passed (a script with no `#!`
line: exec fails with ENOEXEC), is reported with the reason as its cause -- "launch failed: cannot
start ...: Exec format error" -- not as "exit code 127" (issue 20)."""

from __future__ import annotations

from pathlib import Path

from integration.agent.agent_cluster import Cluster

from frenzy.state.messages import EventKind


def test_an_exec_failure_in_the_shim_is_a_launch_failure_with_its_reason(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("echo no shebang line\n")
    script.chmod(0o755)
    cluster.start()
    cluster.launch("job-noexec", [str(script)])
    exited = cluster.wait_event("job-noexec", EventKind.EXITED)
    assert exited.exit_code == 127
    assert exited.cause.startswith(f"launch failed: cannot start '{script}'"), exited.cause
    assert "Exec format error" in exited.cause
