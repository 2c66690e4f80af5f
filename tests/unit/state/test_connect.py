"""The Redis clients' timeouts, chosen from the deadlines the scheduler and the agents keep (no Redis)."""

from __future__ import annotations

from frenzy.state.connect import BLOCK_MARGIN_S, SCHEDULER_BLOCK_S, agent_timeouts, scheduler_timeouts


def test_a_scheduler_learns_of_a_partition_within_its_lease_and_its_blocking_reads_fit() -> None:
    assert scheduler_timeouts(3.0).socket_timeout == 3.0  # the default lease
    short = scheduler_timeouts(1.0)  # a lease shorter than the BLPOP plus the margin
    assert short.socket_timeout == SCHEDULER_BLOCK_S + BLOCK_MARGIN_S > SCHEDULER_BLOCK_S
    assert scheduler_timeouts(60.0).connect_timeout == 5.0


def test_an_agent_times_out_within_a_heartbeat_and_before_its_lease_and_fence() -> None:
    t = agent_timeouts(heartbeat_s=2.0, ttl_s=10.0, block_s=1.0)  # frenzy agent's defaults
    assert t.socket_timeout == 2.0 and t.socket_timeout + 2.0 < 10.0  # a hung beat, then one more, in the lease
    # the launch stream's XREADGROUP BLOCK is never cut short
    assert agent_timeouts(heartbeat_s=0.2, ttl_s=2.0, block_s=0.05).socket_timeout == 0.05 + BLOCK_MARGIN_S
    assert agent_timeouts(heartbeat_s=1.0, ttl_s=10.0, block_s=5.0).socket_timeout == 6.0
