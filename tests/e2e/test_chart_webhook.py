"""The chart's webhook TLS and routing work with the operator's admission server.

The API server here cannot reach a Service-backed webhook (no cluster DNS or proxy), so this
test plays the API server's part: it reads the Secret the chart generated, starts the operator
in `service` mode with that certificate (as the chart's ServiceAccount), and posts
AdmissionReviews to the path of each webhook in the chart's ValidatingWebhookConfiguration,
verifying TLS against the chart's caBundle for the Service's DNS name, exactly as the API server
would.
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


def test_operator_serves_the_chart_webhooks_with_the_chart_certificate(
    cluster: Cluster, operator_factory: Callable[..., Operator], namespace: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, release_ns = f"hook{suffix}", f"crewfence-{suffix}"
    install_chart(cluster, release, release_ns, "--set", "webhook.failurePolicy=Ignore")
    try:
        secret = cluster.get_json("secret", f"{release}-crewfence-webhook-tls", "-n", release_ns)
        certs = tmp_path / "webhook-tls"
        certs.mkdir(mode=0o700)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            path = certs / key
            path.write_bytes(base64.b64decode(secret["data"][key]))
            path.chmod(0o600)
        vwc = cluster.get_json("validatingwebhookconfiguration", f"{release}-crewfence")
        hooks = {w["rules"][0]["resources"][0]: w for w in vwc["webhooks"]}

        sa = f"{release_ns}:{release}-crewfence-operator"
        wait_for_rbac(cluster, sa)
        operator = operator_factory(
            service_account=sa,
            webhook_mode="service",
            extra_env={"CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR": str(certs)},
        )

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", operator.launch.webhook_port), 1).close()
            except OSError:
                return False
            return True

        # kopf opens its admission server once it has scanned the cluster's resources.
        wait_until(listening, timeout=60, what="the operator's webhook server")

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
                conn.request(
                    "POST",
                    service["path"],
                    body=json.dumps(body),
                    headers={"Content-Type": "application/json"},
                )
                response = conn.getresponse()
                assert response.status == 200, response.read()
                return json.loads(response.read())["response"]
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
    finally:
        uninstall = ("uninstall", release, "-n", release_ns, "--wait=false")
        helm(cluster, *uninstall, check=False, timeout=120)
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false")
