"""The token roll's decisions: old+new, switch once every replica accepts new, then new only."""

from __future__ import annotations

import base64

from crewfence_operator.transport import token_roll as roll


def _state(value: str, **ann: str) -> roll.RollState:
    annotations = {getattr(roll, k): v for k, v in ann.items()}
    return roll.RollState.from_secret({
        "metadata": {"annotations": annotations},
        "data": {"token": base64.b64encode(value.encode()).decode()}})


def test_a_roll_moves_through_three_writes_and_never_drops_the_sent_token() -> None:
    steady = _state("old")
    assert roll.decide(steady, None, False, 0.0) is None
    assert roll.decide(steady, "r1", False, 0.0, lambda: "new") is not None
    adding = roll.decide(steady, "r1", False, 0.0, lambda: "new")
    assert adding is not None and adding.value == "old\nnew" and adding.phase == "adding"
    assert roll.sending_token(adding.value) == "old"  # the operator still sends old

    s1 = _state(adding.value, ROLL_ID_ANNOTATION="r1", PHASE_ANNOTATION="adding")
    assert s1.pending == "new"
    assert roll.decide(s1, "r1", False, 10.0) is None  # a replica does not accept new yet
    switched = roll.decide(s1, "r1", True, 10.0)
    assert switched is not None and switched.value == "new\nold"
    assert roll.sending_token(switched.value) == "new"  # both are still accepted

    s2 = _state(switched.value, ROLL_ID_ANNOTATION="r1", PHASE_ANNOTATION="switched",
                SWITCHED_AT_ANNOTATION="10.0")
    assert roll.decide(s2, "r1", False, 10.0 + roll.GRACE_SECONDS - 1) is None
    done = roll.decide(s2, "r1", False, 10.0 + roll.GRACE_SECONDS)
    assert done is not None and done.value == "new" and done.phase == "done"

    s3 = _state("new", ROLL_ID_ANNOTATION="r1", PHASE_ANNOTATION="done")
    assert roll.decide(s3, "r1", True, 100.0) is None  # the same request is not repeated
    again = roll.decide(s3, "r2", False, 100.0, lambda: "newer")
    assert again is not None and again.value == "new\nnewer"


def test_tokens_never_show_in_a_step_repr() -> None:
    step = roll.decide(_state("old-secret"), "r1", False, 0.0, lambda: "new-secret")
    assert step is not None and "secret" not in repr(step)
    assert roll.sending_token(" a \n b \n") == "a" and roll.sending_token("") is None
