from __future__ import annotations

from crewfence_operator.assignment import choose_ordinal, rank_ordinals, rendezvous_score


def test_same_inputs_same_owner_regardless_of_order() -> None:
    for i in range(200):
        action = f"team-a/job-{i}"
        assert choose_ordinal(action, [0, 1, 2]) == choose_ordinal(action, [2, 0, 1, 1])


def test_known_values_are_pinned() -> None:
    # Changing the hash would move every in-flight Action on an operator upgrade.
    assert rendezvous_score("team-a/job", 0) == 6502545961626614458
    assert [choose_ordinal(f"ns/j{i}", [0, 1, 2]) for i in range(12)] == [
        0, 0, 2, 0, 2, 1, 2, 0, 2, 1, 1, 2]


def test_removing_a_replica_moves_only_its_actions() -> None:
    actions = [f"ns/job-{i}" for i in range(500)]
    before = {a: choose_ordinal(a, [0, 1, 2]) for a in actions}
    after = {a: choose_ordinal(a, [0, 2]) for a in actions}
    moved = [a for a in actions if before[a] != after[a]]
    assert moved, "some actions lived on replica 1"
    assert all(before[a] == 1 for a in moved)


def test_spreads_over_replicas() -> None:
    owners = [choose_ordinal(f"ns/job-{i}", [0, 1]) for i in range(1000)]
    share = owners.count(0) / len(owners)
    assert 0.4 < share < 0.6


def test_no_eligible_replica() -> None:
    assert choose_ordinal("ns/x", []) is None
    assert rank_ordinals("ns/x", []) == []


def test_rank_has_every_ordinal_once() -> None:
    ranked = rank_ordinals("ns/x", [3, 1, 2, 1])
    assert sorted(ranked) == [1, 2, 3]
    assert ranked[0] == choose_ordinal("ns/x", [1, 2, 3])


def test_parse_replicas_and_journal_change() -> None:
    from crewfence_operator.crewjob.replicas import journal_changed, parse_replicas

    crew = {"status": {"replicas": [
        {"ordinal": 1, "pod": "c-1", "claim": "c-state-1", "address": "127.0.0.2:8090",
         "journalId": "j1", "ready": True, "fenced": True},
        {"ordinal": 0, "pod": "c-0", "claim": "c-state-0", "address": None, "ready": True},
        {"pod": "no-ordinal"},
    ]}}
    reps = parse_replicas(crew)
    assert [r.ordinal for r in reps] == [0, 1]
    assert not reps[0].eligible  # no address
    assert not reps[1].eligible  # fenced: never dispatched to
    assert journal_changed("j1", "j2")
    assert not journal_changed("j1", "j1")
    assert not journal_changed("j1", None)  # unknown now (pod down) is not "changed"
    assert not journal_changed(None, "j2")


def test_facts_are_looked_for_on_the_assigned_replica_first_then_on_every_other() -> None:
    """crewjob.replicas.asking_order: the one order of the successor gate and the resolution
    handler (a handed-over tombstone lives on another replica than the assigned one)."""
    from crewfence_operator.crewjob.replicas import asking_order, parse_replicas

    crew = {"status": {"replicas": [{"ordinal": o, "address": f"10.0.0.{o}:8443"}
                                    for o in (2, 0, 1)]}}
    listed = parse_replicas(crew)
    assert [r.ordinal for r in asking_order(listed, 1)] == [1, 0, 2]
    assert [r.ordinal for r in asking_order(listed, None)] == [0, 1, 2]
    assert [r.ordinal for r in asking_order(listed, 7)] == [0, 1, 2]  # not listed: all asked
