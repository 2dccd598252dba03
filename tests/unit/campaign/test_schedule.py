"""The campaign schedule: pure, seeded, replayable."""

from __future__ import annotations

from collections import Counter

from campaign.schedule import FAULT_KINDS, KINDS, MAX_GAP, OUTCOMES, SLEEPS, generate


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    assert generate(7, 60) == generate(7, 60)
    assert generate(7, 60) != generate(8, 60)
    assert generate(7, 30) == generate(7, 60)[:30]  # a prefix: a short replay of a long run


def test_work_in_flight_before_the_first_fault() -> None:
    for seed in range(50):
        ops = generate(seed, 5)
        assert [op.kind for op in ops[:2]] == ["apply", "apply"]
        assert [op.index for op in ops] == list(range(5))


def test_a_long_schedule_uses_every_kind_with_valid_arguments() -> None:
    ops = generate(1, 2000)
    kinds = Counter(op.kind for op in ops)
    assert set(kinds) == set(KINDS)
    assert sum(kinds[k] for k in FAULT_KINDS) > 300
    for op in ops:
        assert 0.0 <= op.gap <= MAX_GAP
        assert op.fault == (op.kind in FAULT_KINDS)
        if op.kind == "apply":
            assert op.sleep in SLEEPS and op.policy in ("Cancel", "Orphan")
        if op.kind == "resolve":
            assert op.outcome in OUTCOMES
        if op.kind == "scale":
            assert 1 <= op.replicas <= 3
        if op.kind in ("pause", "sigstop"):
            assert 1 <= op.sleep <= 6
    assert {op.policy for op in ops if op.kind == "apply"} == {"Cancel", "Orphan"}
    assert {op.retention for op in ops if op.kind == "retention"} == {"", "15s", "60s"}


def test_to_dict_keeps_kind_and_index() -> None:
    op = generate(3, 1)[0]
    assert op.to_dict()["kind"] == "apply" and op.to_dict()["index"] == 0
