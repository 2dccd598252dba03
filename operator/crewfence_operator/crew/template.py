"""A hash of what a replica pod was built from, so a spec change rolls the pods."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from crewfence_operator import constants as c

TEMPLATE_HASH_ANNOTATION = f"{c.GROUP}/pod-template-hash"


def template_hash(pod: Mapping[str, Any], crews_file: str) -> str:
    """Covers the pod spec and the crews file (the sidecar reads it only at start)."""
    material = json.dumps({"spec": pod.get("spec"), "crews": crews_file}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def stamp(pod: dict[str, Any], digest: str) -> dict[str, Any]:
    pod.setdefault("metadata", {}).setdefault("annotations", {})[TEMPLATE_HASH_ANNOTATION] = digest
    return pod


def pod_template_hash(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(TEMPLATE_HASH_ANNOTATION)
    return str(value) if value else None
