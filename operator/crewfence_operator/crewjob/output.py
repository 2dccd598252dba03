"""Bounding a job's output: up to 32 KiB in status, a larger one (≤ 1 MiB) in a ConfigMap.

Invariant (an output that fits in status needs no ConfigMap): ``status.output`` always holds
the output's sha256, its size and its first ``STATUS_VALUE_MAX_BYTES``; a ConfigMap is
written only when that start is not the whole output (:attr:`BoundedOutput.needs_configmap`),
so a small output costs no API write beyond the terminal status patch. When a ConfigMap is
used it is this CrewJob's (:func:`configmap_fit`, issue 19).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

STATUS_VALUE_MAX_BYTES: Final = 32 * 1024
# A ConfigMap's data may total 1 MiB; keep a little room for the key.
CONFIGMAP_VALUE_MAX_BYTES: Final = 1024 * 1024 - 1024
CONFIGMAP_KEY: Final = "output"


def output_text(value: Any) -> str:
    """The output as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def truncate_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """At most ``max_bytes`` UTF-8 bytes of ``text``, cut on a character boundary."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text, False
    return encoded[:max_bytes].decode("utf-8", "ignore"), True


@dataclass(frozen=True)
class BoundedOutput:
    sha256: str
    size: int
    status_value: str
    status_truncated: bool
    configmap_value: str
    configmap_truncated: bool

    @property
    def needs_configmap(self) -> bool:
        """The status copy is not the whole output: only then is a ConfigMap written."""
        return self.status_truncated

    def status_fields(self, configmap_name: str | None) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "value": self.status_value, "sha256": self.sha256, "size": self.size,
            "truncated": self.status_truncated,
        }
        if configmap_name:
            fields["configMap"] = {"name": configmap_name, "key": CONFIGMAP_KEY,
                                   "truncated": self.configmap_truncated}
        return fields


def bound_output(value: Any, *, status_max: int = STATUS_VALUE_MAX_BYTES,
                 configmap_max: int = CONFIGMAP_VALUE_MAX_BYTES) -> BoundedOutput | None:
    """None when there is no output at all."""
    if value is None:
        return None
    text = output_text(value)
    encoded = text.encode("utf-8", "surrogatepass")
    status_value, status_truncated = truncate_utf8(text, status_max)
    cm_value, cm_truncated = truncate_utf8(text, configmap_max)
    return BoundedOutput(sha256=hashlib.sha256(encoded).hexdigest(), size=len(encoded),
                         status_value=status_value, status_truncated=status_truncated,
                         configmap_value=cm_value, configmap_truncated=cm_truncated)


def configmap_name(crewjob_name: str) -> str:
    """``<name>-output``, shortened with a hash when that would exceed 253 characters."""
    name = f"{crewjob_name}-output"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(crewjob_name.encode()).hexdigest()[:10]
    return f"{crewjob_name[:230].rstrip('-.')}-{digest}-output"


class ConfigMapFit(StrEnum):
    """How an existing ConfigMap of the output's name relates to this CrewJob."""

    OURS = "ours"
    """Owned by this CrewJob (its uid) and holding exactly this output: nothing to do."""
    REPLACE = "replace"
    """Ours with other data, or left by an earlier CrewJob of the same name (deleted and
    re-applied, not yet garbage-collected, or orphaned): rewrite it with this CrewJob as its
    owner."""
    FOREIGN = "foreign"
    """Somebody else's: never touched; the status says the full output is not stored."""


def configmap_fit(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> ConfigMapFit:
    """Invariant (the output ConfigMap is this CrewJob's): status points at a ConfigMap only
    when it is owned by this CrewJob's uid and holds this output. A crewfence output ConfigMap
    of a previous CrewJob of the same name is taken over; anything else is left alone."""
    meta, want_meta = existing.get("metadata") or {}, wanted["metadata"]
    our_uid = want_meta["ownerReferences"][0]["uid"]
    owners = meta.get("ownerReferences") or []
    ours = any(o.get("uid") == our_uid for o in owners)
    if ours and (existing.get("data") or {}) == wanted["data"]:
        return ConfigMapFit.OURS
    labels = meta.get("labels") or {}
    same_job = {k: labels.get(k) for k in want_meta["labels"]} == want_meta["labels"]
    # Left by an earlier CrewJob of this name: still owned by it, or orphaned (deleted with
    # --cascade=orphan: the garbage collector removed the owner reference, our labels stay).
    earlier = all(
        o.get("kind") == want_meta["ownerReferences"][0]["kind"]
        and o.get("name") == want_meta["ownerReferences"][0]["name"] for o in owners)
    if ours or (same_job and earlier):
        return ConfigMapFit.REPLACE
    return ConfigMapFit.FOREIGN


def foreign_configmap_note(name: str) -> str:
    return (f"ConfigMap {name} exists and does not belong to this CrewJob; it was left alone "
            "and the full output is not stored (status.output.value holds its start)")
