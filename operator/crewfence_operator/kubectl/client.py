"""What every verb of ``kubectl crewfence`` shares: the API client from the user's kubeconfig
(context and namespace as kubectl reads them), one-line errors, reading a CrewJob, output.

Invariant: an error is one printable line (``PluginError``, exit status 1), never a traceback
or an API response body beyond its ``message``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator.crewjob import resolution as res

FIELD_MANAGER = res.FIELD_MANAGER


class PluginError(Exception):
    """One printable line; exit status 1."""


@dataclass
class Kube:
    api: client.CustomObjectsApi
    core: client.CoreV1Api
    namespace: str


def connect(args: argparse.Namespace) -> Kube:
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        if args.context:
            contexts, _ = config.list_kube_config_contexts(config_file=args.kubeconfig)
            active = next((ctx for ctx in contexts if ctx["name"] == args.context), active)
    except (config.ConfigException, OSError) as exc:
        raise PluginError(f"cannot load the kubeconfig: {exc}") from None
    namespace = args.namespace or (active.get("context") or {}).get("namespace") or "default"
    api_client = client.ApiClient()
    return Kube(client.CustomObjectsApi(api_client), client.CoreV1Api(api_client), namespace)


def api_error(exc: ApiException) -> PluginError:
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except ValueError:
        message = exc.reason
    return PluginError(f"the API server refused ({exc.status}): {message}")


def get_job(kube: Kube, name: str) -> dict[str, Any]:
    try:
        obj = kube.api.get_namespaced_custom_object(c.GROUP, c.VERSION, kube.namespace,
                                                    c.CREWJOB_PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            raise PluginError(f"CrewJob {name!r} not found in namespace {kube.namespace}") \
                from None
        raise api_error(exc) from None
    assert isinstance(obj, dict)
    return obj


def condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    """The status condition of type ``ctype``; ``{}`` when there is none."""
    return next((cnd for cnd in status.get("conditions") or []
                 if isinstance(cnd, Mapping) and cnd.get("type") == ctype), {})


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """``data`` for ``-o json|yaml``, else ``text`` for people."""
    if args.output == "json":
        print(json.dumps(data, indent=2, ensure_ascii=False))
    elif args.output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        print(text)


def kubectl_flags(*, top: bool) -> argparse.ArgumentParser:
    """kubectl's flags, accepted before and after the subcommand (after wins)."""
    common = argparse.ArgumentParser(add_help=False)
    default: Any = None if top else argparse.SUPPRESS
    common.add_argument("-n", "--namespace", default=default,
                        help="the namespace (default: the context's)")
    common.add_argument("--context", default=default, help="the kubeconfig context to use")
    common.add_argument("--kubeconfig", default=default, help="path to the kubeconfig file")
    common.add_argument("-o", "--output", choices=["json", "yaml"], default=default,
                        help="output format")
    return common
