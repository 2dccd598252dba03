"""Create what a Crew needs (blocking API calls; run in a thread). Never overwrites a pod.

Pods are never listed here: the operator keeps them in a kopf index fed by its pod watch
(:func:`pod_index_entry`, registered in handlers/crew.py), and each pass reads that index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator import kube
from crewfence_operator.crew.adoption import adoption_patch, is_orphan
from crewfence_operator.crew.identity import CrewRef, parse_ordinal, state_claim_labels
from crewfence_operator.crew.pod import PodSettings, replica_pod
from crewfence_operator.crew.resources import (
    claim_for_ordinal,
    crews_configmap,
    headless_service,
    render_crews_file,
    state_claim,
    token_secret,
)
from crewfence_operator.crew.scaledown import RELEASED_ANNOTATION, RETAINED_ANNOTATION
from crewfence_operator.crew.spec import CrewSpec
from crewfence_operator.crew.template import pod_template_hash, stamp, template_hash
from crewfence_operator.transport import cert_source
from crewfence_operator.transport.token_roll import new_token


class ChildError(RuntimeError):
    """Something the user must fix (shown in the Ready condition)."""


@dataclass
class Snapshot:
    """What exists after one ensure pass."""

    namespace_pods: list[dict[str, Any]]
    """The namespace's indexed pods (replica pods and pods mounting a claim)."""
    pods: dict[int, dict[str, Any]]
    """The operator's replica pods by ordinal (including terminating ones)."""
    claims: dict[int, dict[str, Any]]
    """This Crew's state claims by ordinal."""
    created_pods: list[str] = field(default_factory=list)


def pod_index_entry(body: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The pod index's value for one pod: ``{namespace: slim pod}``, or None (not indexed).

    Indexed: the operator's replica pods, and any pod that mounts a PersistentVolumeClaim (the
    shared-state audit looks for foreign pods on state claims). Kept: metadata without managed
    fields, the claim volumes under their own names, and status (phase, podIP, conditions).

    Invariant (the claim a replica lists is the one its pod mounts): the state volume keeps its
    name, so :func:`~crewfence_operator.crew.pod.mounted_state_claim` reads the indexed pod as
    it reads the full one. Renamed, the Crew's status listed the claim the spec asks for next
    to the journal id of a pod that mounts another, and a job read "journal changed".
    """
    meta = body.get("metadata") or {}
    namespace = meta.get("namespace")
    labels = meta.get("labels") or {}
    claim_volumes = [
        {"name": v.get("name"), "persistentVolumeClaim": {"claimName": claim}}
        for v in (body.get("spec") or {}).get("volumes") or ()
        if isinstance(v, Mapping)
        and (claim := (v.get("persistentVolumeClaim") or {}).get("claimName"))]
    if not namespace or (labels.get(c.LABEL_MANAGED_BY) != c.MANAGED_BY_VALUE
                         and not claim_volumes):
        return None
    status = body.get("status") or {}
    slim = {
        "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
        "spec": {"volumes": claim_volumes},
        "status": {k: status[k] for k in ("phase", "podIP", "conditions") if k in status},
    }
    return {str(namespace): slim}


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


def observe(crew: CrewRef, spec: CrewSpec, pods: Iterable[Mapping[str, Any]]) -> Snapshot:
    """This Crew's pods (from ``pods``, the namespace's indexed pods) and state claims."""
    listed = [dict(p) for p in pods]
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
        namespace_pods=listed,
        pods=_index_by_ordinal(crew, listed, lambda o: c.pod_name(crew.name, o)),
        claims=claim_by_ordinal,
    )


def ensure(
    crew: CrewRef, spec: CrewSpec, settings: PodSettings, pods: Iterable[Mapping[str, Any]], *,
    full: bool = True,
) -> Snapshot:
    """Create missing children for ordinals 0..replicas-1 and return what exists.

    ``pods``: the namespace's pods as the watch last saw them (the pod index). Writes happen
    only for what is missing or changed (a create answered 409 still counts as a write request
    for the API server). ``full=False`` skips the per-Crew Secret, Service and ConfigMap checks
    (the daemon does them on spec changes and now and then).
    """
    if full:
        if not kube.exists("Secret", crew.namespace, c.token_secret_name(crew.name)):
            kube.create_if_absent(token_secret(crew, new_token()))
        _ensure_configmap(crew, spec)
        if not kube.exists("Service", crew.namespace, c.service_name(crew.name)):
            kube.create_if_absent(headless_service(crew, settings.port))
    snap = observe(crew, spec, pods)
    adopt_orphans(crew, snap)
    if settings.sidecar_tls and full:
        # Before any pod that mounts them: the Crew CA and each replica's certificate
        # (re-issued before expiry and once the pod's IP is known).
        try:
            cert_source.ensure_replica_certificates(
                crew, sorted(set(range(spec.replicas)) | set(snap.pods)), snap.pods,
                settings.cert_manager)
        except cert_source.CertManagerUnavailable as exc:
            raise ChildError(str(exc)) from None
    for ordinal in range(spec.replicas):
        if ordinal not in snap.claims:
            _ensure_claim(crew, spec, ordinal)
        elif _has_release_marks(snap.claims[ordinal]):
            _ensure_claim(crew, spec, ordinal)
    create_pods(crew, spec, settings, snap, range(spec.replicas))
    return snap


def adopt_orphans(crew: CrewRef, snap: Snapshot) -> None:
    """Make this Crew the controller of its orphaned pods and claims again (``adoption``);
    the snapshot's objects are updated in place, so this pass's audit sees them as ours."""
    for pod in snap.pods.values():
        if is_orphan(pod, crew) and kube.patch_pod(
                crew.namespace, pod["metadata"]["name"], adoption_patch(pod, crew)):
            pod["metadata"] = {**pod["metadata"], **adoption_patch(pod, crew)["metadata"]}
    for claim in snap.claims.values():
        if is_orphan(claim, crew):
            patch = adoption_patch(claim, crew)
            try:
                kube.patch_claim(crew.namespace, claim["metadata"]["name"], patch)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                continue
            claim["metadata"] = {**claim["metadata"], **patch["metadata"]}


def create_pods(
    crew: CrewRef, spec: CrewSpec, settings: PodSettings, snap: Snapshot,
    ordinals: Iterable[int],
) -> None:
    """Create the pod of each ordinal that has none; record them in ``snap``.

    One pod object per ordinal, ever: a terminating pod still holds the claim, so a
    replacement is created only once the old object is gone (its deletion wakes us). The index
    may lag behind a create: the create itself is by name, so a second one answers 409.
    """
    for ordinal in ordinals:
        if ordinal in snap.pods:
            continue
        pod = desired_pod(crew, spec, ordinal, settings)
        if kube.create_if_absent(pod):
            snap.created_pods.append(c.pod_name(crew.name, ordinal))
            snap.pods[ordinal] = pod


def _has_release_marks(claim: Mapping[str, Any]) -> bool:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return RELEASED_ANNOTATION in annotations or RETAINED_ANNOTATION in annotations


def apply_claim_annotations(
    namespace: str, claim: str, annotations: Mapping[str, str | None]
) -> None:
    """Merge-patch a claim's annotations (None removes one)."""
    kube.patch_claim(namespace, claim, {"metadata": {"annotations": dict(annotations)}})
