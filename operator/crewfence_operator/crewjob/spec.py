"""A CrewJob's spec as the Action it describes: the effective action id, key and request."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crewfence_sidecar import contract
from crewfence_sidecar.contract import ContractError, Operation, StartRequest


class DeletionPolicy(StrEnum):
    CANCEL = "Cancel"
    ORPHAN = "Orphan"


class SpecError(Exception):
    """The spec cannot become a valid sidecar request; nothing is dispatched."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def default_action_id(namespace: str, name: str) -> str:
    """``<namespace>/<name>``: a re-applied manifest is the same Action (never a UID)."""
    return f"{namespace}/{name}"


def default_idempotency_key(action_id: str) -> str:
    """A key derived only from the action id, so every operator instance derives the same."""
    return "crewfence-" + hashlib.sha256(action_id.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class JobSpec:
    namespace: str
    name: str
    crew: str
    operation: Operation
    input: dict[str, Any]
    timeout_ms: int | None
    action_id: str
    idempotency_key: str
    cancel: bool
    deletion_policy: DeletionPolicy
    resume_from: str | None = None
    """``spec.resume`` (with ``spec.supersedes``): the predecessor's action id, the default
    one of the CrewJob ``spec.supersedes`` names (``<namespace>/<supersedes>``); the gate
    refuses a predecessor whose action id differs. Part of the start request and its hash."""

    @classmethod
    def from_resource(cls, namespace: str, name: str, spec: Mapping[str, Any]) -> JobSpec:
        """Validate with the wire contract; raise :class:`SpecError` on anything it refuses."""
        crew = str((spec.get("crewRef") or {}).get("name") or "")
        if not crew:
            raise SpecError("invalid_spec", "spec.crewRef.name is required")
        raw_op = spec.get("operation")
        try:
            operation = Operation(str(raw_op))
        except ValueError:
            raise SpecError("invalid_spec", f"unknown operation {raw_op!r}") from None
        raw_input = spec.get("input")
        job_input: dict[str, Any] = dict(raw_input) if isinstance(raw_input, Mapping) else {}
        timeout = spec.get("timeoutMs")
        timeout_ms = int(timeout) if timeout is not None else None
        action_id = str(spec.get("actionId") or default_action_id(namespace, name))
        key = spec.get("idempotencyKey")
        idempotency_key = str(key) if key else default_idempotency_key(action_id)
        resume_from = (default_action_id(namespace, str(spec["supersedes"]))
                       if spec.get("resume") and spec.get("supersedes") else None)
        if spec.get("resume") and resume_from is None:
            raise SpecError("invalid_spec", "spec.resume needs spec.supersedes")
        try:
            request = StartRequest(crew_id=crew, action_id=action_id, operation=operation,
                                   input=job_input, timeout_ms=timeout_ms,
                                   resume_from=resume_from)
            contract.parse_start_request(request.to_wire())
            contract.validate_operation_input(operation, job_input)
            contract.validate_idempotency_key(idempotency_key)
        except ContractError as exc:
            raise SpecError(exc.code, exc.message) from None
        policy = DeletionPolicy(str(spec.get("deletionPolicy") or DeletionPolicy.CANCEL))
        return cls(namespace=namespace, name=name, crew=crew, operation=operation,
                   input=job_input, timeout_ms=timeout_ms, action_id=action_id,
                   idempotency_key=idempotency_key, cancel=bool(spec.get("cancel", False)),
                   deletion_policy=policy, resume_from=resume_from)

    def start_request(self) -> StartRequest:
        return StartRequest(crew_id=self.crew, action_id=self.action_id,
                            operation=self.operation, input=self.input,
                            timeout_ms=self.timeout_ms, resume_from=self.resume_from)

    def request_hash(self) -> str:
        return contract.request_hash(self.start_request(), self.idempotency_key)

    @property
    def thread_backed(self) -> bool:
        return contract.OPERATION_TRAITS[self.operation].thread_backed
