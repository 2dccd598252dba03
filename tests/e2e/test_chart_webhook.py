"""The chart's webhook TLS and routing work with the operator's admission server.

The chart renders no certificate: the operator (as the chart's ServiceAccount, with the chart's
environment) keeps its serving certificate in a Secret and injects the CA into the chart's
ValidatingWebhookConfiguration. The API server here cannot reach a Service-backed webhook (no
cluster DNS or proxy), so this test plays the API server's part: it posts AdmissionReviews to the
path of each webhook in the chart's configuration, verifying TLS against the injected caBundle
for the Service's DNS name, exactly as the API server would. A restart reuses the certificate; a
certificate near expiry is renewed and re-injected.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chart_support import helm, install_chart, wait_for_rbac
from harness.handles import Cluster, Operator, wait_until


class ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to a local port, verified and SNI-named as the webhook Service's DNS name."""

    def __init__(self, dns_name: str, port: int, context: ssl.SSLContext) -> None:
        super().__init__(dns_name, port, context=context, timeout=30)

    def connect(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def review(
    resource: str, kind: dict[str, str], obj: dict[str, Any], namespace: str
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": {"group": kind["group"], "version": kind["version"], "resource": resource},
            "requestKind": kind,
            "requestResource": {
                "group": kind["group"],
                "version": kind["version"],
                "resource": resource,
            },
            "name": obj["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def crew(namespace: str, access_mode: str) -> dict[str, Any]:
    return {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "Crew",
        "metadata": {"name": "hooked", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "operations": ["run"],
            "llm": {"model": "crewfence/offline"},
            "agents": {"a": {"role": "R", "goal": "G {topic}", "backstory": "B"}},
            "tasks": [
                {"name": "t", "agent": "a", "description": "D {topic}", "expected_output": "O"}
            ],
            "storage": {"size": "64Mi", "accessMode": access_mode},
        },
    }


def chart_env(cluster: Cluster, release: str, release_ns: str) -> dict[str, str]:
    """The webhook settings the chart's Deployment gives the operator (but a local cert dir)."""
    deployment = cluster.get_json("deployment", f"{release}-crewfence-operator", "-n", release_ns)
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]
           ["env"] if e["name"].startswith("CREWFENCE_OPERATOR_WEBHOOK_") and "value" in e}
    env.pop("CREWFENCE_OPERATOR_WEBHOOK_ADDR")
    env.pop("CREWFENCE_OPERATOR_WEBHOOK_PORT")
    env.pop("CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR")
    return env


def test_operator_keeps_the_chart_webhook_certificate(
    cluster: Cluster, operator_factory: Callable[..., Operator], namespace: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, release_ns = f"hook{suffix}", f"crewfence-{suffix}"
    install_chart(cluster, release, release_ns)
    secret_name = f"{release}-crewfence-webhook-tls"
    try:
        assert cluster.get_json("secret", secret_name, "-n", release_ns) is None
        env = chart_env(cluster, release, release_ns)
        assert env["CREWFENCE_OPERATOR_WEBHOOK_TLS_SECRET"] == f"{release_ns}/{secret_name}"
        sa = f"{release_ns}:{release}-crewfence-operator"
        wait_for_rbac(cluster, sa)
        wait_until(lambda: cluster.kubectl("auth", "can-i", "get", f"secret/{secret_name}",
                                           "-n", release_ns, as_sa=sa).stdout.strip() == "yes",
                   timeout=30, what="the chart's webhook-tls Role")

        def start() -> Operator:
            certs_dir = tmp_path / uuid.uuid4().hex[:6]
            op = operator_factory(service_account=sa, webhook_mode="service", extra_env={
                **env, "CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR": str(certs_dir)})
            wait_until(lambda: listening(op.launch.webhook_port), timeout=60,
                       what="the operator's webhook server")
            return op

        operator = start()
        secret = cluster.get_json("secret", secret_name, "-n", release_ns)
        vwc = cluster.get_json("validatingwebhookconfiguration", f"{release}-crewfence")
        bundles = {w["clientConfig"]["caBundle"] for w in vwc["webhooks"]}
        assert bundles == {secret["data"]["ca.crt"]}
        check_reviews(vwc, operator, namespace)

        # A restart reuses the kept certificate: nothing rotates, nothing to re-inject.
        operator = start()
        again = cluster.get_json("secret", secret_name, "-n", release_ns)
        assert again["data"] == secret["data"]

        # A certificate within 30 days of expiry is renewed and its CA injected again.
        from crewfence_operator.transport import certs

        short = certs.generate(tmp_path / "short", [f"{release}-crewfence-webhook"], days=10)
        data = {k: base64.b64encode(p.read_bytes()).decode() for k, p in
                (("tls.crt", short.cert), ("tls.key", short.key), ("ca.crt", short.ca))}
        cluster.kubectl("patch", "secret", secret_name, "-n", release_ns, "--type=merge",
                        "-p", json.dumps({"data": data}), check=True)
        operator = start()
        renewed = cluster.get_json("secret", secret_name, "-n", release_ns)
        assert renewed["data"]["ca.crt"] not in (data["ca.crt"], secret["data"]["ca.crt"])
        vwc = cluster.get_json("validatingwebhookconfiguration", f"{release}-crewfence")
        assert {w["clientConfig"]["caBundle"] for w in vwc["webhooks"]} == {
            renewed["data"]["ca.crt"]}
        check_reviews(vwc, operator, namespace)
    finally:
        uninstall = ("uninstall", release, "-n", release_ns, "--wait=false")
        helm(cluster, *uninstall, check=False, timeout=120)
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false")


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
    except OSError:
        return False
    return True


def check_reviews(vwc: dict[str, Any], operator: Operator, namespace: str) -> None:
    hooks = {w["rules"][0]["resources"][0]: w for w in vwc["webhooks"]}

    def post(resource: str, body: dict[str, Any]) -> dict[str, Any]:
        hook = hooks[resource]
        service = hook["clientConfig"]["service"]
        context = ssl.create_default_context(
            cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode()
        )
        conn = ServiceConnection(
            f"{service['name']}.{service['namespace']}.svc",
            operator.launch.webhook_port,
            context,
        )
        try:
            conn.request("POST", service["path"], body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200, response.read()
            answer: dict[str, Any] = json.loads(response.read())["response"]
            return answer
        finally:
            conn.close()

    crew_kind = {"group": "crewfence.dev", "version": "v1alpha1", "kind": "Crew"}
    refused = post(
        "crews", review("crews", crew_kind, crew(namespace, "ReadWriteMany"), namespace)
    )
    assert refused["allowed"] is False
    assert "ReadWriteMany" in refused["status"]["message"]
    admitted = post(
        "crews", review("crews", crew_kind, crew(namespace, "ReadWriteOncePod"), namespace)
    )
    assert admitted["allowed"] is True
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    pod_kind = {"group": "", "version": "v1", "kind": "Pod"}
    assert post("pods", review("pods", pod_kind, pod, namespace))["allowed"] is True
