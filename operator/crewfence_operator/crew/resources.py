"""Manifests for the per-Crew objects: token Secret, crews-file ConfigMap, headless Service, PVC."""

from __future__ import annotations

from typing import Any

import yaml

from crewfence_operator import constants as c
from crewfence_operator.crew.identity import (
    CrewRef,
    crew_labels,
    object_meta,
    state_claim_labels,
)
from crewfence_operator.crew.spec import CrewSpec
from crewfence_operator.crew.tools import render_tools

LLM_API_KEY_ENV = "CREWFENCE_LLM_API_KEY"


def token_secret(crew: CrewRef, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(crew, c.token_secret_name(crew.name), crew_labels(crew)),
        "type": "Opaque",
        "stringData": {c.TOKEN_SECRET_KEY: token},
    }


def render_crews_file(crew: CrewRef, spec: CrewSpec) -> str:
    """The sidecar's CREWFENCE_CREWS_FILE: one declarative crew whose crew_id is the Crew's name."""
    llm: dict[str, Any] = {"model": spec.llm.model}
    if spec.llm.api_key_secret_ref is not None:
        llm["api_key_env"] = LLM_API_KEY_ENV
    if spec.llm.base_url:
        llm["base_url"] = spec.llm.base_url
    if spec.llm.temperature is not None:
        llm["temperature"] = spec.llm.temperature
    definition: dict[str, Any] = {
        "process": spec.process,
        "llm": llm,
        "agents": {name: dict(agent) for name, agent in spec.agents.items()},
        "tasks": [dict(task) for task in spec.tasks],
    }
    if spec.knowledge:
        definition["knowledge"] = [{"name": k.name, "content": k.content} for k in spec.knowledge]
    if spec.tools:
        # Paths and names only: header values stay in their Secrets (crew/tools.py).
        definition["tools"] = render_tools(spec.tools)
    document = {"crews": {crew.name: definition}} if spec.declarative else {"crews": {}}
    return yaml.safe_dump(document, sort_keys=True, allow_unicode=True)


def crews_configmap(crew: CrewRef, spec: CrewSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(crew, c.crews_configmap_name(crew.name), crew_labels(crew)),
        "data": {c.CREWS_FILE_KEY: render_crews_file(crew, spec)},
    }


def headless_service(crew: CrewRef, port: int = c.SIDECAR_PORT) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(crew, c.service_name(crew.name), crew_labels(crew)),
        "spec": {
            "clusterIP": "None",
            "selector": crew_labels(crew),
            "publishNotReadyAddresses": False,
            "ports": [{"name": c.SIDECAR_PORT_NAME, "port": port, "targetPort": port,
                       "protocol": "TCP"}],
        },
    }


def state_claim(crew: CrewRef, spec: CrewSpec, ordinal: int) -> dict[str, Any]:
    claim_spec: dict[str, Any] = {
        "accessModes": [spec.storage.access_mode],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": spec.storage.size}},
    }
    if spec.storage.storage_class_name:
        claim_spec["storageClassName"] = spec.storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(
            crew, c.claim_name(crew.name, ordinal), state_claim_labels(crew, ordinal)
        ),
        "spec": claim_spec,
    }


def claim_for_ordinal(crew: CrewRef, spec: CrewSpec, ordinal: int) -> str:
    if spec.storage.existing_claim and ordinal == 0:
        return spec.storage.existing_claim
    return c.claim_name(crew.name, ordinal)
