"""Signed control messages (frenzy.state.signing), without Redis: what is accepted and what is refused."""

from __future__ import annotations

import json

import pytest

from frenzy.state import signing
from frenzy.state.messages import AgentEvent, EventKind, LaunchMessage, LayoutEnv, encode, payload, sealed
from frenzy.state.signing import KeyCache, KeyRing, Refusal, ReplayGuard, Verifier

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
NOW = 1_700_000_000.0


def entry(at: float, seq: int = 0) -> str:
    """A stream entry id written at ``at`` (unix seconds)."""
    return f"{int(at * 1000)}-{seq}"


def launch(**fields: object) -> LaunchMessage:
    base: dict = dict(job_id="job-0123456789ab", attempt=1, fence=7, node="n1", node_rank=0, nnodes=1,
                      nproc_per_node=2, gpu_indices=[0, 1], gpu_uuids=["GPU-a", "GPU-b"], master_addr="10.0.0.1",
                      master_port=29500, rdzv_id="job-0123456789ab-1", command=["python", "train.py"],
                      env={"A": "1"}, layout=LayoutEnv(gpu_type="A100-80GB", tp=2, pp=1, dp=1, zero_stage=0,
                                                       micro_batch=1, grad_accum=1))
    return LaunchMessage(**{**base, **fields})


def wire(msg: LaunchMessage | AgentEvent, key: bytes = KEY, now: float = NOW, ttl_s: float = 120.0) -> dict:
    """The JSON object a reader gets from the stream for ``msg`` sealed with ``key``."""
    return payload(encode(sealed(msg, key, now, ttl_s)))


def test_a_sealed_launch_is_accepted_and_what_the_reader_parses_is_what_was_signed() -> None:
    obj = wire(launch())
    assert len(obj["nonce"]) == 32 and obj["expires_at"] == int(NOW + 120) + 1 and len(obj["sig"]) == 64
    assert Verifier().check(obj, KeyRing(KEY), entry(NOW + 1)) is None
    # model_dump (what is signed) and the JSON on the wire read back agree, floats included.
    event = sealed(AgentEvent(kind=EventKind.EXITED, job_id="j", attempt=1, node="n1", exit_code=-9,
                              at=1712345678.1234567), KEY)
    assert event.model_dump(mode="json") == json.loads(encode(event)["data"])


@pytest.mark.parametrize("field", sorted(launch().model_dump(mode="json")) + ["nonce", "expires_at"])
def test_changing_any_field_is_refused(field: str) -> None:
    obj = wire(launch())
    value = obj[field]
    obj[field] = (value + 1 if isinstance(value, int) else [] if isinstance(value, list) else
                  {"x": "y"} if isinstance(value, dict) else str(value) + "x")
    assert Verifier().check(obj, KeyRing(KEY), entry(NOW + 1)) == Refusal.FORGED


def test_adding_or_removing_a_field_is_refused() -> None:
    added = {**wire(launch()), "workdir": "/etc"}
    removed = wire(launch())
    del removed["env"]
    for obj in (added, removed):
        assert Verifier().check(obj, KeyRing(KEY), entry(NOW + 1)) == Refusal.FORGED


def test_another_nodes_key_is_refused_and_so_is_no_key() -> None:
    obj = wire(launch(), key=OTHER)
    assert Verifier().check(obj, KeyRing(KEY), entry(NOW + 1)) == Refusal.FORGED
    assert Verifier().check(obj, None, entry(NOW + 1)) == Refusal.NO_KEY


def test_unsigned_is_refused() -> None:
    plain = payload(encode(launch()))
    assert Verifier().check(plain, KeyRing(KEY), entry(NOW)) == Refusal.UNSIGNED
    no_sig = {k: v for k, v in wire(launch()).items() if k != "sig"}
    assert Verifier().check(no_sig, KeyRing(KEY), entry(NOW)) == Refusal.UNSIGNED


def test_expiry_is_judged_on_when_the_entry_was_written() -> None:
    obj = wire(launch(), ttl_s=120)
    assert Verifier().check(obj, KeyRing(KEY), entry(NOW + 200)) == Refusal.EXPIRED
    # Written in time, read an hour later (the reader was down): still acted on.
    assert Verifier().check(obj, KeyRing(KEY), entry(NOW + 100)) is None
    sealed_in_the_past = wire(launch(), now=NOW - 1000)
    assert Verifier().check(sealed_in_the_past, KeyRing(KEY), entry(NOW)) == Refusal.EXPIRED


def test_a_replay_is_refused_but_a_redelivery_of_the_same_entry_is_not() -> None:
    verifier = Verifier()
    obj = wire(launch())
    first = entry(NOW + 1)
    assert verifier.check(obj, KeyRing(KEY), first) is None
    assert verifier.check(obj, KeyRing(KEY), first) is None  # the same entry read again (pending list)
    assert verifier.check(obj, KeyRing(KEY), entry(NOW + 2)) == Refusal.REPLAYED  # re-added: a copy
    # A forged copy never reaches the guard: the real message is still new to it.
    fresh = Verifier()
    assert fresh.check({**obj, "fence": 0}, KeyRing(KEY), entry(NOW + 1)) == Refusal.FORGED
    assert fresh.check(obj, KeyRing(KEY), entry(NOW + 2)) is None


def test_the_previous_key_is_accepted_after_a_rotation_and_signers_switch_later() -> None:
    rotated = KeyRing(OTHER, previous=KEY, rotated_at=NOW)
    assert Verifier().check(wire(launch(), key=KEY), rotated, entry(NOW + 1)) is None
    assert Verifier().check(wire(launch(), key=OTHER), rotated, entry(NOW + 1)) is None
    assert rotated.signing_key(NOW + 1) == KEY  # readers with a ring from before the rotation still accept
    assert rotated.signing_key(NOW + signing.SWITCH_AFTER_S) == OTHER
    assert KeyRing(KEY).signing_key(NOW) == KEY
    # Two rotations on: the oldest key is refused.
    assert Verifier().check(wire(launch(), key=KEY), KeyRing(bytes(32), OTHER), entry(NOW + 1)) == Refusal.FORGED


def test_the_guard_forgets_nonces_once_the_stream_is_past_their_expiry() -> None:
    guard = ReplayGuard()
    for i in range(100):
        assert guard.admit(f"n{i}", NOW + 10, entry(NOW, i), NOW)
    assert len(guard) == 100
    assert guard.admit("late", NOW + 100, entry(NOW + 20), NOW + 20)
    assert len(guard) == 1


def test_a_key_ring_needs_a_real_key() -> None:
    with pytest.raises(ValueError):
        KeyRing(b"short")
    assert KeyRing.from_hex(KEY.hex(), "", 5.0) == KeyRing(KEY, None, 5.0)


def test_the_key_cache_reads_once_per_max_age_and_on_refresh_at_most_once_a_second() -> None:
    reads: list[list[str]] = []
    clock = [0.0]
    store = {"a": KeyRing(KEY), "b": KeyRing(OTHER)}

    def fetch(nodes: list[str]) -> dict[str, KeyRing | None]:
        reads.append(nodes)
        return {n: store.get(n) for n in nodes}

    cache = KeyCache(fetch, lambda: clock[0], max_age_s=5.0)
    assert cache.rings(["a", "b", "c"]) == {"a": KeyRing(KEY), "b": KeyRing(OTHER), "c": None}
    assert cache.ring("a") == KeyRing(KEY) and cache.ring("c") is None
    assert reads == [["a", "b", "c"]]  # one read for all three, none after
    store["a"] = KeyRing(OTHER, KEY)
    clock[0] = 0.5
    assert cache.refresh("a") == KeyRing(KEY)  # read half a second ago: not again
    clock[0] = 1.5
    assert cache.refresh("a") == KeyRing(OTHER, KEY)
    clock[0] = 7.0
    cache.rings(["a", "b"])
    assert reads[-1] == ["a", "b"]
