"""Thin, blocking helpers over the ``kubernetes`` client.

Every function here blocks: call them from sync handlers or through ``asyncio.to_thread``.
Objects go in and come out as plain dicts (camelCase keys, as the API serves them).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c

MERGE_PATCH = "application/merge-patch+json"
_lock = threading.Lock()


_client: client.ApiClient | None = None


def api_client() -> client.ApiClient:
    """One shared client: in-cluster credentials when present, else the kubeconfig."""
    global _client
    with _lock:
        if _client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            _client = client.ApiClient()
        return _client


def reset() -> None:
    """Forget the client (the next call loads credentials again)."""
    global _client
    with _lock:
        _client = None


def use_api_server(host: str) -> None:
    """Point the helpers at another API server (tests against kmock)."""
    global _client
    configuration = client.Configuration()
    configuration.host = host
    with _lock:
        _client = client.ApiClient(configuration)


def core() -> client.CoreV1Api:
    return client.CoreV1Api(api_client())


def custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client())


def to_dict(obj: Any) -> dict[str, Any]:
    result = api_client().sanitize_for_serialization(obj)
    assert isinstance(result, dict)
    return result


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, ApiException) and exc.status in codes


# --- Crews -------------------------------------------------------------------------------------

def _get_custom(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One crewfence object of ``plural``; None when it does not exist (404)."""
    try:
        obj = custom().get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    assert isinstance(obj, dict)
    return obj


def get_crew(namespace: str, name: str) -> dict[str, Any] | None:
    return _get_custom(c.CREW_PLURAL, namespace, name)


def get_crewjob(namespace: str, name: str) -> dict[str, Any] | None:
    return _get_custom(c.CREWJOB_PLURAL, namespace, name)


def list_crews(namespace: str) -> list[dict[str, Any]]:
    result = custom().list_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.CREW_PLURAL)
    return list(result.get("items") or [])


def patch_crew_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    custom().patch_namespaced_custom_object_status(
        c.GROUP, c.VERSION, namespace, c.CREW_PLURAL, name, {"status": status})


def patch_crewjob_status(namespace: str, name: str, body: dict[str, Any]) -> Any:
    """Merge-patch a CrewJob's status subresource; ``body`` holds ``status`` and may hold
    ``metadata.resourceVersion`` (a concurrent change then answers 409). The API's answer."""
    return custom().patch_namespaced_custom_object_status(
        c.GROUP, c.VERSION, namespace, c.CREWJOB_PLURAL, name, body)


def patch_crewjob_status_unless_gone(namespace: str, name: str, status: dict[str, Any]) -> bool:
    """Merge-patch a CrewJob's status; False when the CrewJob is gone (404)."""
    return _succeeds_unless(404, lambda: patch_crewjob_status(namespace, name,
                                                              {"status": status}))


# --- core objects ------------------------------------------------------------------------------

def _succeeds_unless(status: int, call: Callable[[], object]) -> bool:
    """Run one API call: True when it succeeds, False when it answers `status`, else raise."""
    try:
        call()
    except ApiException as exc:
        if exc.status == status:
            return False
        raise
    return True


def create_if_absent(body: dict[str, Any]) -> bool:
    """Create a namespaced core object; False when it already exists (never overwritten)."""
    kind, ns = body["kind"], body["metadata"]["namespace"]
    api = core()
    creators = {
        "Secret": api.create_namespaced_secret,
        "ConfigMap": api.create_namespaced_config_map,
        "Service": api.create_namespaced_service,
        "PersistentVolumeClaim": api.create_namespaced_persistent_volume_claim,
        "Pod": api.create_namespaced_pod,
    }
    return _succeeds_unless(409, lambda: creators[kind](ns, body))


def exists(kind: str, namespace: str, name: str) -> bool:
    """A GET (a read, unlike a create that answers 409): is this core object there?"""
    api = core()
    readers = {
        "Secret": api.read_namespaced_secret,
        "Service": api.read_namespaced_service,
    }
    return _succeeds_unless(404, lambda: readers[kind](name, namespace))


def read_secret_value(namespace: str, name: str, key: str) -> str | None:
    try:
        secret = core().read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    raw = (secret.data or {}).get(key)
    return base64.b64decode(raw).decode() if raw else None


def replace_configmap(body: dict[str, Any], resource_version: str) -> bool:
    """Replace a ConfigMap guarded by its resourceVersion; False when it changed or went."""
    meta = body["metadata"]
    guarded = {**body, "metadata": {**meta, "resourceVersion": resource_version}}
    try:
        core().replace_namespaced_config_map(meta["name"], meta["namespace"], guarded)
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def get_configmap(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return to_dict(core().read_namespaced_config_map(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_configmap(namespace: str, name: str, patch: dict[str, Any]) -> None:
    core().patch_namespaced_config_map(name, namespace, patch, _content_type=MERGE_PATCH)


def get_claim(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return to_dict(core().read_namespaced_persistent_volume_claim(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_claim(namespace: str, name: str, patch: dict[str, Any]) -> None:
    core().patch_namespaced_persistent_volume_claim(name, namespace, patch,
                                                    _content_type=MERGE_PATCH)


def list_claims(namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
    result = core().list_namespaced_persistent_volume_claim(namespace,
                                                            label_selector=label_selector)
    return [to_dict(item) for item in result.items]


def delete_claim(namespace: str, name: str) -> None:
    try:
        core().delete_namespaced_persistent_volume_claim(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise


def list_pods(namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
    result = core().list_namespaced_pod(namespace, label_selector=label_selector)
    return [to_dict(item) for item in result.items]


def patch_pod(namespace: str, name: str, patch: dict[str, Any]) -> bool:
    """Merge-patch a pod; False when it changed meanwhile (409) or is gone (404)."""
    try:
        core().patch_namespaced_pod(name, namespace, patch, _content_type=MERGE_PATCH)
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def delete_pod(namespace: str, name: str, uid: str | None = None) -> None:
    """Delete a pod; with ``uid`` only that incarnation (a precondition), never a successor."""
    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)) if uid else None
    try:
        core().delete_namespaced_pod(name, namespace, body=body)
    except ApiException as exc:
        if exc.status not in (404, 409):
            raise
