"""QueuePolicy's options are string enums: strings from a flag or a JSON file still work."""

from __future__ import annotations

import json

import pytest

from has import PlanChoice, QueueOrder, QueuePolicy, StarvingOrder


def test_strings_become_the_enum_members() -> None:
    policy = QueuePolicy(order="shortest", starving_order="ideal", plan_choice="completion")
    assert policy.order is QueueOrder.SHORTEST
    assert policy.starving_order is StarvingOrder.IDEAL
    assert policy.plan_choice is PlanChoice.COMPLETION
    assert policy == QueuePolicy(order=QueueOrder.SHORTEST, starving_order=StarvingOrder.IDEAL,
                                 plan_choice=PlanChoice.COMPLETION)


def test_members_compare_and_serialise_as_their_strings() -> None:
    policy = QueuePolicy.frenzy()
    assert policy.order == "shortest" and policy.plan_choice == "ranked-wait"
    assert json.loads(json.dumps({"order": policy.order})) == {"order": "shortest"}


@pytest.mark.parametrize("knob", ["order", "starving_order", "plan_choice"])
def test_an_unknown_string_is_rejected_naming_the_choices(knob: str) -> None:
    with pytest.raises(ValueError, match=f"{knob} must be '"):
        QueuePolicy(**{knob: "sideways"})  # type: ignore[arg-type]


def test_named_policies_are_the_simulators_and_unknown_names_list_the_choices() -> None:
    # one table for `frenzy scheduler --policy` and `frenzy simulate` (has.sim.baselines)
    from has import POLICY_NAMES
    from has.sim.baselines import FrenzyPolicy, make_policy

    assert QueuePolicy.named("frenzy") == QueuePolicy.frenzy()
    assert QueuePolicy.named("frenzy-paper") == QueuePolicy()
    assert QueuePolicy.named("frenzy-completion").plan_choice is PlanChoice.COMPLETION
    assert QueuePolicy.named("frenzy", starvation_s=5.0).starvation_s == 5.0
    for name in POLICY_NAMES:
        sim = make_policy(name, restart_s=77.0)
        assert isinstance(sim, FrenzyPolicy) and sim.name == name
        assert sim.queue_policy == QueuePolicy.named(name, preempt_restart_s=77.0, explain=False)
    assert len({QueuePolicy.named(n) for n in POLICY_NAMES}) == len(POLICY_NAMES)  # no two alike
    with pytest.raises(ValueError, match="unknown policy 'fastest'; one of frenzy, .*frenzy-paper"):
        QueuePolicy.named("fastest")
