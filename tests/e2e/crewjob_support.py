"""Helpers shared by the CrewJob e2e tests, the demo and the operator benchmark.

Everything goes through kubectl (as a user would) or the sidecar's own HTTP API, never
through operator internals. The sidecar is reached the way the operator reaches it
(``crew_access``): HTTPS verified against the Crew's CA and the replica's DNS name, with a
client certificate of that CA and the Crew's token, all read from the Secrets the operator
creates; plain HTTP only for a Crew without a CA (an operator started with
``CREWFENCE_OPERATOR_SIDECAR_TLS=0``).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import socket
import ssl
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import yaml
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.transport import pki
from crewfence_operator.transport.ca_rotation import CaState
from crewfence_operator.transport.cert_manager import operator_client_name
from crewfence_operator.transport.cert_manager_apply import client_tls_from_secret
from crewfence_operator.transport.token_roll import sending_token
from harness import controlplane
from harness.handles import Cluster, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TERMINAL = ("Succeeded", "Failed", "Cancelled")


class Kubectl(Protocol):
    def kubectl(self, *args: str, input: str | None = None, as_sa: str | None = None,
                check: bool = False, timeout: float = 120) -> Any: ...

    def get_json(self, *args: str, as_sa: str | None = None) -> Any: ...


# The harness's poller, at the gentler interval these kubectl-heavy waits have always used.
wait_for = partial(wait_until, interval=0.5)


@contextmanager
def crewjob_namespace(cluster: Cluster, prefix: str) -> Iterator[str]:
    """A fresh namespace that can run sidecar pods; it and its pods are deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name, check=True)
    controlplane.ensure_default_service_account(cluster.info, name)
    yield name
    cluster.kubectl("delete", "pods", "--all", "-n", name, "--wait=false")
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def research_crew(replicas: int) -> dict[str, Any]:
    """examples/crew-research.yaml with `replicas` replicas and without knowledge sources."""
    crew: dict[str, Any] = yaml.safe_load((EXAMPLES / "crew-research.yaml").read_text())
    crew["spec"]["replicas"] = replicas
    # Without knowledge sources: with them, a slow model call currently blocks the sidecar's
    # event loop (cancel and reads time out until it returns) - reported to the sidecar owners;
    # examples/crew-research.yaml itself (with knowledge) is covered by test_crewjob_examples.
    crew["spec"].pop("knowledge", None)
    return crew


def apply_file(cluster: Kubectl, path: Path, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(path), check=True)


def apply_obj(cluster: Kubectl, obj: dict[str, Any], namespace: str) -> Any:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))


def crewjob_manifest(name: str, operation: str, job_input: dict[str, Any], *,
                     crew: str = "research", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
            "metadata": {"name": name},
            "spec": {"crewRef": {"name": crew}, "operation": operation, "input": job_input,
                     **spec}}


def get_job(cluster: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cluster.get_json("crewjob", name, "-n", namespace)
    return found


def delete_job(cluster: Kubectl, namespace: str, name: str) -> None:
    """``kubectl delete crewjob`` and wait until it is gone (a GitOps prune)."""
    cluster.kubectl("delete", "crewjob", name, "-n", namespace, "--wait=true",
                    "--timeout=120s", check=True)
    assert get_job(cluster, namespace, name) is None


def ledger_calls(cluster: Cluster, token: str) -> int:
    """Model calls the offline LLM made for a task whose text carries ``token``, counted
    outside every journal (``controlplane.offline_llm_ledger``)."""
    ledger = controlplane.offline_llm_ledger(cluster.info)
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return sum(token in str(json.loads(x).get("task", "")) for x in lines if x.strip())


def wait_phase(cluster: Kubectl, namespace: str, name: str,
               phases: Iterable[str] = TERMINAL, timeout: float = 240) -> dict[str, Any]:
    wanted = tuple(phases)

    def check() -> dict[str, Any] | None:
        obj = get_job(cluster, namespace, name)
        phase = ((obj or {}).get("status") or {}).get("phase")
        return obj if phase in wanted else None

    try:
        result: dict[str, Any] = wait_for(check, timeout=timeout,
                                          what=f"CrewJob {name} to reach {'/'.join(wanted)}")
    except AssertionError as exc:
        obj = get_job(cluster, namespace, name)
        raise AssertionError(f"{exc}; last status: {json.dumps((obj or {}).get('status'))}") \
            from None
    return result


def full_output(cluster: Kubectl, namespace: str, obj: Mapping[str, Any]) -> str:
    """A finished CrewJob's whole output, as a user reads it: ``status.output.value`` when it
    is not truncated (then no ConfigMap exists), else the ConfigMap it names (owned by this
    CrewJob); either way its sha256 and size are the ones in status."""
    out = obj["status"]["output"]
    name = str(obj["metadata"]["name"])
    if not out["truncated"]:
        assert "configMap" not in out, "an output that fits in status needs no ConfigMap"
        found = cluster.kubectl("get", "configmap", f"{name}-output", "-n", namespace)
        assert found.returncode != 0, "no ConfigMap is written for an output that fits"
        text = str(out["value"])
    else:
        cm = cluster.get_json("configmap", out["configMap"]["name"], "-n", namespace)
        assert cm["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        text = str(cm["data"][out["configMap"]["key"]])
        assert not out["configMap"]["truncated"] and text.startswith(out["value"])
    assert len(text.encode()) == out["size"]
    assert hashlib.sha256(text.encode()).hexdigest() == out["sha256"]
    return text


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def crew_replicas(cluster: Kubectl, namespace: str, crew: str) -> list[dict[str, Any]]:
    obj = cluster.get_json("crew", crew, "-n", namespace) or {}
    return list((obj.get("status") or {}).get("replicas") or [])


def wait_crew_ready(cluster: Kubectl, namespace: str, crew: str, replicas: int,
                    timeout: float = 300) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        reps = crew_replicas(cluster, namespace, crew)
        ready = [r for r in reps if r.get("ready") and r.get("address")]
        return reps if len(ready) >= replicas else None

    result: list[dict[str, Any]] = wait_for(check, timeout=timeout,
                                            what=f"Crew {crew} with {replicas} ready replicas")
    return result


def crew_token(cluster: Kubectl, namespace: str, crew: str) -> str:
    secret = cluster.get_json("secret", f"{crew}-crewfence-token", "-n", namespace)
    return base64.b64decode(secret["data"]["token"]).decode()


class _ReplicaHTTPS(http.client.HTTPSConnection):
    """HTTPS to a replica's address (its pod IP) that verifies the served certificate for
    the replica's DNS name, as the operator does (``server_hostname``), not for the IP."""

    def __init__(self, host: str, port: int, *, context: ssl.SSLContext, server_name: str,
                 timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls_context, self._server_name = context, server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls_context.wrap_socket(self.sock, server_hostname=self._server_name)


@dataclass(frozen=True)
class SidecarAccess:
    """What a client needs to talk to one Crew's sidecars the way the operator does."""

    namespace: str
    crew: str
    token: str = field(repr=False)
    """The token the operator sends (the first line during a token roll)."""
    context: ssl.SSLContext | None = field(default=None, repr=False)
    """Trusts the Crew's CA(s), presents a client certificate of it; None: plain HTTP."""

    def server_name(self, ordinal: int) -> str:
        return pki.replica_dns_name(CrewRef(self.crew, self.namespace, ""), ordinal)

    def request(self, replica: Mapping[str, Any], path: str, *, method: str = "GET",
                body: bytes | None = None, headers: Mapping[str, str] | None = None,
                timeout: float = 10) -> tuple[int, str]:
        """One request to the replica of a Crew status entry (``address``, ``ordinal``):
        ``(HTTP status, body text)``. A certificate that does not name this replica raises
        ``ssl.SSLCertVerificationError``."""
        status, _, text = self.exchange(replica, path, method=method, body=body,
                                        headers=headers, timeout=timeout)
        return status, text

    def exchange(self, replica: Mapping[str, Any], path: str, *, method: str = "GET",
                 body: bytes | None = None, headers: Mapping[str, str] | None = None,
                 timeout: float = 10) -> tuple[int, dict[str, str], str]:
        """Like ``request``, with the answer's headers."""
        host, _, port = str(replica["address"]).rpartition(":")
        conn: http.client.HTTPConnection
        if self.context is None:
            conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
        else:
            conn = _ReplicaHTTPS(host.strip("[]"), int(port), context=self.context,
                                 server_name=self.server_name(int(replica["ordinal"])),
                                 timeout=timeout)
        try:
            conn.request(method, path, body=body,
                         headers={"Authorization": f"Bearer {self.token}", **(headers or {})})
            resp = conn.getresponse()
            return int(resp.status), dict(resp.getheaders()), resp.read().decode()
        finally:
            conn.close()


def crew_access(cluster: Kubectl, namespace: str, crew: str) -> SidecarAccess:
    """The Crew's token and, when the Crew has TLS material (mutual TLS, the default), a
    context like the operator's, from the Secrets the operator keeps: with its own CA per
    Crew, a client certificate of the signing CA (``CrewClientTLS``) verified against the
    trust bundle (both CAs while the CA rotates); with cert-manager, the operator's client
    certificate Secret itself. Neither: plain HTTP (``CREWFENCE_OPERATOR_SIDECAR_TLS=0``)."""
    token = sending_token(crew_token(cluster, namespace, crew)) or ""
    context: ssl.SSLContext | None = None
    state = CaState.from_secret(
        cluster.get_json("secret", pki.ca_secret_name(crew), "-n", namespace))
    if state is not None:
        context = pki.CrewClientTLS.for_ca(state.signing, state.trust).context
    else:
        issued = client_tls_from_secret(cluster.get_json(
            "secret", operator_client_name(crew), "-n", namespace))
        context = issued.context if issued is not None else None
    return SidecarAccess(namespace, crew, token, context)


def sidecar_get(replica: Mapping[str, Any], path: str, access: SidecarAccess,
                timeout: float = 10) -> tuple[int, str]:
    """``GET path`` on the replica of a Crew status entry, as the operator would."""
    return access.request(replica, path, timeout=timeout)


def metric_total(text: str, name: str) -> float:
    """Sum of every sample of ``name`` (all label sets) in Prometheus text format."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$")
    for line in text.splitlines():
        m = pattern.match(line.strip())
        if m:
            total += float(m.group(1))
    return total


def llm_calls(cluster: Kubectl, namespace: str, crew: str) -> dict[int, float]:
    """crewfence_offline_llm_calls_total per ready replica ordinal (process-lifetime counters)."""
    access = crew_access(cluster, namespace, crew)
    out: dict[int, float] = {}
    for rep in crew_replicas(cluster, namespace, crew):
        if not rep.get("address"):
            continue
        status, text = sidecar_get(rep, "/metrics", access)
        if status == 200:
            out[int(rep["ordinal"])] = metric_total(text, "crewfence_offline_llm_calls_total")
    return out


def sidecar_record(cluster: Kubectl, namespace: str, crew: str, ordinal: int,
                   action_id: str) -> tuple[int, dict[str, Any] | None]:
    from urllib.parse import quote

    access = crew_access(cluster, namespace, crew)
    rep = next(r for r in crew_replicas(cluster, namespace, crew) if r["ordinal"] == ordinal)
    status, text = sidecar_get(rep, f"/jobs/{quote(action_id, safe='')}", access)
    return status, (json.loads(text) if text.startswith("{") else None)


def events_for(cluster: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    found = cluster.get_json("events", "-n", namespace,
                             f"--field-selector=involvedObject.name={name}")
    return list((found or {}).get("items") or [])


def wait_warning(cluster: Kubectl, namespace: str, name: str, reason_prefix: str,
                 timeout: float = 60) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        for ev in events_for(cluster, namespace, name):
            if ev.get("type") == "Warning" and str(ev.get("reason", "")).startswith(
                    reason_prefix):
                return ev
        return None

    result: dict[str, Any] = wait_for(check, timeout=timeout,
                                      what=f"Warning Event {reason_prefix}* on {name}")
    return result


def operator_metric(url: str, name: str, label: str | None = None) -> float:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    if label is None:
        return metric_total(text, name)
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def https_get(address: str, path: str, token: str, ctx: ssl.SSLContext,
              server_name: str) -> tuple[int, str]:
    """HTTPS GET to a replica's address on a fresh connection (a fresh handshake), verifying
    the certificate for ``server_name``; the HTTP status and body."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=15) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {server_name}\r\n"
                    f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    if not data:  # TLS 1.3: a refused client certificate shows as a closed connection
        raise ConnectionError("the connection closed without an HTTP answer")
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


@contextmanager
def service_account_with_rules(cluster: Kubectl, prefix: str,
                               rules: list[dict[str, Any]]) -> Iterator[str]:
    """A fresh namespace with a ServiceAccount bound cluster-wide to exactly ``rules``;
    yields ``"<namespace>:<name>"`` (what ``operator_factory(service_account=...)`` takes)
    and removes the namespace, role and binding afterwards."""
    suffix = uuid.uuid4().hex[:6]
    ns, name, role = f"{prefix}-{suffix}", "crewfence-operator", f"{prefix}-{suffix}"
    cluster.kubectl("create", "namespace", ns, check=True)
    cluster.kubectl("create", "serviceaccount", name, "-n", ns, check=True)
    cluster.kubectl("apply", "-f", "-", check=True, input=yaml.safe_dump_all([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}]))
    try:
        yield f"{ns}:{name}"
    finally:
        cluster.kubectl("delete", "clusterrolebinding", role, "--wait=false")
        cluster.kubectl("delete", "clusterrole", role, "--wait=false")
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
