from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from crewfence_operator.crewjob.output import (
    CONFIGMAP_VALUE_MAX_BYTES,
    STATUS_VALUE_MAX_BYTES,
    ConfigMapFit,
    bound_output,
    configmap_fit,
    configmap_name,
    output_text,
    truncate_utf8,
)
from crewfence_operator.handlers.crewjob import configmap_body, merge_status, without_configmap


def test_none_means_no_output() -> None:
    assert bound_output(None) is None


def test_small_output_is_complete_everywhere() -> None:
    # the AIP run output (crewAI's CrewOutput in JSON mode, task ids added)
    run = {"raw": "hi", "pydantic": None, "json_dict": None,
           "tasks_output": [{"id": "t1", "raw": "hi"}], "token_usage": {}}
    out = bound_output(run)
    assert out is not None
    text = output_text(run)
    assert json.loads(text) == run
    assert out.status_value == out.configmap_value == text
    assert not out.status_truncated and not out.configmap_truncated
    assert out.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert out.size == len(text.encode())


def test_large_output_is_bounded_and_flagged() -> None:
    big = "é" * (STATUS_VALUE_MAX_BYTES)  # 2 bytes each: twice the status bound
    out = bound_output(big)
    assert out is not None
    assert out.status_truncated and not out.configmap_truncated
    assert len(out.status_value.encode()) <= STATUS_VALUE_MAX_BYTES
    assert out.configmap_value == big
    assert out.size == 2 * STATUS_VALUE_MAX_BYTES


def test_over_one_mib_is_truncated_in_the_configmap_too() -> None:
    huge = "x" * (CONFIGMAP_VALUE_MAX_BYTES + 10)
    out = bound_output(huge)
    assert out is not None and out.configmap_truncated
    assert len(out.configmap_value.encode()) == CONFIGMAP_VALUE_MAX_BYTES
    assert out.sha256 == hashlib.sha256(huge.encode()).hexdigest()  # of the full output
    fields = out.status_fields("job-output")
    assert fields["configMap"] == {"name": "job-output", "key": "output", "truncated": True}


def test_truncation_never_splits_a_character() -> None:
    text, cut = truncate_utf8("a€b", 2)
    assert (text, cut) == ("a", True)


def test_configmap_name_fits() -> None:
    assert configmap_name("job") == "job-output"
    long = "a" * 253
    name = configmap_name(long)
    assert len(name) <= 253 and name.endswith("-output")
    assert name != configmap_name("a" * 252 + "b")


# --- the output ConfigMap belongs to this CrewJob (issue 19) ---------------------------------
def _cm(uid: str, value: str, *, name: str = "job-1", labelled: bool = True) -> dict[str, Any]:
    body = configmap_body({"metadata": {"name": name, "namespace": "team-a", "uid": uid}},
                          "job-1-output", value)
    if not labelled:
        body["metadata"]["labels"] = {}
    return body


def test_a_configmap_of_this_crewjob_with_this_output_is_ours() -> None:
    assert configmap_fit(_cm("u1", "out"), _cm("u1", "out")) is ConfigMapFit.OURS


@pytest.mark.parametrize("existing", [
    _cm("u1", "other output"),   # ours, other data
    _cm("u0", "old output"),     # the previous CrewJob of this name (deleted, re-applied)
    {**_cm("u0", "old"), "metadata": {**_cm("u0", "old")["metadata"],
                                      "ownerReferences": []}},   # orphaned by its CrewJob
])
def test_ours_with_other_data_or_an_earlier_crewjobs_is_replaced(existing: Any) -> None:
    assert configmap_fit(existing, _cm("u1", "out")) is ConfigMapFit.REPLACE


@pytest.mark.parametrize("existing", [
    {"metadata": {"name": "job-1-output"}, "data": {"output": "mine"}},   # a user's own
    _cm("u0", "old", labelled=False),                                      # not crewfence's
    _cm("u0", "old", name="another-job"),                                  # another CrewJob's
])
def test_anything_else_is_foreign_and_never_touched(existing: Any) -> None:
    assert configmap_fit(existing, _cm("u1", "out")) is ConfigMapFit.FOREIGN


def test_a_foreign_configmap_takes_the_pointer_out_of_the_patch() -> None:
    patch = {"phase": "Succeeded", "output": {"value": "out", "sha256": "s", "size": 3,
                                              "configMap": {"name": "job-1-output"}}}
    status = merge_status({}, without_configmap(patch, "job-1-output"))
    assert "configMap" not in status["output"] and status["output"]["value"] == "out"
    assert "does not belong to this CrewJob" in status["output"]["configMapError"]
