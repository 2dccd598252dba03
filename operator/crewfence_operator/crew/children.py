"""Create what a Crew needs (blocking API calls; run in a thread). Never overwrites a pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crewfence_operator import constants as c
from crewfence_operator import kube
from crewfence_operator.crew.identity import CrewRef, parse_ordinal, state_claim_labels
from crewfence_operator.crew.pod import PodSettings, replica_pod
from crewfence_operator.crew.resources import (
    claim_for_ordinal,
    crews_configmap,
    headless_service,
    new_token,
    render_crews_file,
    state_claim,
    token_secret,
)
from crewfence_operator.crew.scaledown import RELEASED_ANNOTATION, RETAINED_ANNOTATION
from crewfence_operator.crew.spec import CrewSpec
from crewfence_operator.crew.template import pod_template_hash, stamp, template_hash


class ChildError(RuntimeError):
    """Something the user must fix (shown in the Ready condition)."""


@dataclass
class Snapshot:
    """What exists after one ensure pass."""

    namespace_pods: list[dict[str, Any]]
    pods: dict[int, dict[str, Any]]
    """The operator's replica pods by ordinal (including terminating ones)."""
    claims: dict[int, dict[str, Any]]
    """This Crew's state claims by ordinal."""
    created_pods: list[str] = field(default_factory=list)


def desired_pod(
    crew: CrewRef, spec: CrewSpec, ordinal: int, settings: PodSettings
) -> dict[str, Any]:
    pod = replica_pod(crew, spec, ordinal, settings)
    return stamp(pod, template_hash(pod, render_crews_file(crew, spec)))


def desired_hash(crew: CrewRef, spec: CrewSpec, ordinal: int, settings: PodSettings) -> str:
    return pod_template_hash(desired_pod(crew, spec, ordinal, settings)) or ""


def _ensure_configmap(crew: CrewRef, spec: CrewSpec) -> None:
    wanted = crews_configmap(crew, spec)
    existing = kube.get_configmap(crew.namespace, wanted["metadata"]["name"])
    if existing is None:
        kube.create_if_absent(wanted)
    elif (existing.get("data") or {}) != wanted["data"]:
        kube.patch_configmap(crew.namespace, wanted["metadata"]["name"], {"data": wanted["data"]})


def _ensure_claim(crew: CrewRef, spec: CrewSpec, ordinal: int) -> None:
    name = claim_for_ordinal(crew, spec, ordinal)
    labels = state_claim_labels(crew, ordinal)
    if spec.storage.existing_claim and ordinal == 0:
        existing = kube.get_claim(crew.namespace, name)
        if existing is None:
            raise ChildError(f'storage.existingClaim "{name}" does not exist')
        current = (existing.get("metadata") or {}).get("labels") or {}
        owner = current.get(c.LABEL_CREW)
        if owner and owner != crew.name:
            raise ChildError(f'claim "{name}" already holds the state of Crew "{owner}"')
        if any(current.get(k) != v for k, v in labels.items()):
            kube.patch_claim(crew.namespace, name, {"metadata": {"labels": labels}})
        return
    if kube.create_if_absent(state_claim(crew, spec, ordinal)):
        return
    existing = kube.get_claim(crew.namespace, name)
    annotations = ((existing or {}).get("metadata") or {}).get("annotations") or {}
    stale = {k: None for k in (RELEASED_ANNOTATION, RETAINED_ANNOTATION) if k in annotations}
    if stale:  # scaled back up: the claim serves a replica again
        kube.patch_claim(crew.namespace, name, {"metadata": {"annotations": stale}})


def _index_by_ordinal(
    crew: CrewRef, objs: list[dict[str, Any]], name_for: Any
) -> dict[int, dict[str, Any]]:
    result: dict[int, dict[str, Any]] = {}
    for obj in objs:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(c.LABEL_MANAGED_BY) != c.MANAGED_BY_VALUE:
            continue
        if labels.get(c.LABEL_CREW) != crew.name:
            continue
        ordinal = parse_ordinal(labels.get(c.LABEL_REPLICA))
        if ordinal is not None and meta.get("name") == name_for(ordinal):
            result[ordinal] = obj
    return result


def observe(crew: CrewRef, spec: CrewSpec, settings: PodSettings) -> Snapshot:
    pods = kube.list_pods(crew.namespace)
    claims = kube.list_claims(crew.namespace, f"{c.LABEL_CREW}={crew.name},"
                                              f"{c.LABEL_ROLE}={c.ROLE_STATE}")
    claim_by_ordinal: dict[int, dict[str, Any]] = {}
    for claim in claims:
        ordinal = parse_ordinal(((claim.get("metadata") or {}).get("labels") or {})
                                .get(c.LABEL_REPLICA))
        if ordinal is not None and claim["metadata"]["name"] == claim_for_ordinal(
                crew, spec, ordinal):
            claim_by_ordinal[ordinal] = claim
    return Snapshot(
        namespace_pods=pods,
        pods=_index_by_ordinal(crew, pods, lambda o: c.pod_name(crew.name, o)),
        claims=claim_by_ordinal,
    )


def ensure(
    crew: CrewRef, spec: CrewSpec, settings: PodSettings, *, full: bool = True
) -> Snapshot:
    """Create missing children for ordinals 0..replicas-1 and return what exists.

    Writes happen only for what is missing or changed (a create answered 409 still counts as a
    write request for the API server). ``full=False`` skips the per-Crew Secret, Service and
    ConfigMap checks (the daemon does them on spec changes and now and then).
    """
    if full:
        if not kube.exists("Secret", crew.namespace, c.token_secret_name(crew.name)):
            kube.create_if_absent(token_secret(crew, new_token()))
        _ensure_configmap(crew, spec)
        if not kube.exists("Service", crew.namespace, c.service_name(crew.name)):
            kube.create_if_absent(headless_service(crew, settings.port))
    snap = observe(crew, spec, settings)
    for ordinal in range(spec.replicas):
        if ordinal not in snap.claims:
            _ensure_claim(crew, spec, ordinal)
        elif _has_release_marks(snap.claims[ordinal]):
            _ensure_claim(crew, spec, ordinal)
    created: list[str] = []
    for ordinal in range(spec.replicas):
        # One pod object per ordinal, ever: a terminating pod still holds the claim, so a
        # replacement is created only once the old object is gone (its deletion wakes us).
        if ordinal in snap.pods:
            continue
        if kube.create_if_absent(desired_pod(crew, spec, ordinal, settings)):
            created.append(c.pod_name(crew.name, ordinal))
    if created:
        snap = observe(crew, spec, settings)
        snap.created_pods = created
    return snap


def _has_release_marks(claim: Mapping[str, Any]) -> bool:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return RELEASED_ANNOTATION in annotations or RETAINED_ANNOTATION in annotations


def apply_claim_annotations(namespace: str, claim: str, annotations: Mapping[str, str]) -> None:
    kube.patch_claim(namespace, claim, {"metadata": {"annotations": dict(annotations)}})
