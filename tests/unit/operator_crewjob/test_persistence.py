"""kopf's diff base is not kept on CrewJobs (``crewfence_operator/persistence.py``): one API
write per CrewJob less, and nothing that needs it."""

from __future__ import annotations

import kopf
from crewfence_operator import config
from crewfence_operator import constants as c
from crewfence_operator.main import apply_settings

CREWJOB = {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
           "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "annotations": {
               "crewfence.dev/last-handled-configuration": '{"spec": {"old": 1}}\n'}},
           "spec": {"crewRef": {"name": "research"}}}
CREW = {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
        "metadata": {"name": "research", "namespace": "ns", "uid": "u2"}, "spec": {}}


def _settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    apply_settings(settings, config.OperatorConfig(standalone=True))
    return settings


def test_the_operator_writes_no_diff_base_on_a_crewjob() -> None:
    storage = _settings().persistence.diffbase_storage
    patch = kopf.Patch()
    storage.store(body=kopf.Body(CREWJOB), patch=patch,
                  essence=storage.build(body=kopf.Body(CREWJOB)))
    assert not patch, f"a CrewJob's first cycle would cost a metadata patch: {dict(patch)}"
    # An annotation left by an older operator is not read either (the cause stays 'creation').
    assert storage.fetch(body=kopf.Body(CREWJOB)) is None


def test_other_kinds_keep_the_diff_base() -> None:
    storage = _settings().persistence.diffbase_storage
    patch = kopf.Patch()
    essence = storage.build(body=kopf.Body(CREW))
    storage.store(body=kopf.Body(CREW), patch=patch, essence=essence)
    key = f"{c.KOPF_PREFIX}/last-handled-configuration"
    assert key in patch["metadata"]["annotations"]


def test_crewjobs_have_no_handler_that_needs_a_diff_base() -> None:
    """Only on.delete may watch CrewJob changes: a create/update/resume handler compares
    against the diff base, which CrewJobs no longer keep."""
    import crewfence_operator.main  # noqa: F401  (registers every handler)

    registry = kopf.get_default_registry()
    resource = kopf.Resource(c.GROUP, c.VERSION, c.CREWJOB_PLURAL)
    handlers = registry._changing.get_resource_handlers(resource=resource)
    assert handlers, "the CrewJob deletion handler is registered"
    assert {h.reason for h in handlers} == {kopf.Reason.DELETE}, [h.id for h in handlers]
