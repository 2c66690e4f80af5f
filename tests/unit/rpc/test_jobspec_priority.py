"""The priority field: one range for every entry point (JobEntry, and the proto a gRPC client
sends straight), and who may raise it (``frenzy.auth.roles.priority_refusal``)."""

from __future__ import annotations

import pytest

from frenzy.auth.roles import Role, priority_refusal
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.rpc.spec_limits import check_spec
from frenzy.scheduler.service import UserQuotas

ENTRY = {"model": "gpt2-124m", "seq_len": 1024, "global_batch": 32, "command": ["true"]}


def test_default_is_zero_and_bounds_reach_the_proto() -> None:
    assert parse_entry(ENTRY).to_proto().priority == 0
    for p in (-100, -1, 7, 100):
        assert parse_entry({**ENTRY, "priority": p}).to_proto().priority == p
    assert parse_entry({**ENTRY, "priority": "5"}).priority == 5  # a YAML / form value


@pytest.mark.parametrize("bad, says", [
    (101, "priority: Input should be less than or equal to 100"),
    (-101, "priority: Input should be greater than or equal to -100"),
    (2.5, "priority: Input should be a valid integer"),
    (1e300, "priority: out of range: at most 100"),
    ("high", "priority: Input should be a valid integer"),
])  # fmt: skip
def test_out_of_range_names_the_field(bad: object, says: str) -> None:
    with pytest.raises(JobSpecError, match=says):
        parse_entry({**ENTRY, "priority": bad})


def test_a_grpc_client_cannot_skip_the_range() -> None:
    spec = parse_entry(ENTRY).to_proto()
    for p in (-100, 100):
        spec.priority = p
        check_spec(spec)
    for p in (101, -101, 2**31 - 1):
        spec.priority = p
        with pytest.raises(ValueError, match=rf"spec.priority: {p}; must be -100..100"):
            check_spec(spec)


def test_users_lower_freely_raise_up_to_the_cap_admins_anything() -> None:
    for role in (Role.SUBMIT, Role.READ):
        assert priority_refusal(role, -100, 0) is None
        assert priority_refusal(role, 0, 0) is None
        assert priority_refusal(role, 10, 10) is None
        why = priority_refusal(role, 100, 0)
        assert why is not None and why.startswith("spec.priority: 100 is above 0") and "To fix:" in why
        assert "--max-user-priority" in why
        assert priority_refusal(role, 11, 10) is not None
        assert priority_refusal(role, -5, -10) is not None  # a cap below 0 holds users below normal
    assert priority_refusal(Role.ADMIN, 100, 0) is None
    assert priority_refusal(Role.ADMIN, -100, 0) is None


def test_the_cap_is_checked_where_it_is_set() -> None:
    assert UserQuotas(max_priority=50).max_priority == 50
    with pytest.raises(ValueError, match=r"max user priority must be -100..100 \(got 101\)"):
        UserQuotas(max_priority=101)
