"""What `helm template` renders, object by object (schemas: tests/e2e/test_chart_validate.py)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest
from chart_helpers import CHART, NAMESPACE, RELEASE, Helm, find, one
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

OPERATOR = f"{RELEASE}-crewfence-operator"
WEBHOOK = f"{RELEASE}-crewfence-webhook"


def env_of(pod_spec: dict[str, Any]) -> dict[str, Any]:
    container = pod_spec["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_default_is_one_operator_with_recreate(helm: Helm) -> None:
    docs = helm.render()
    deployment = one(docs, "Deployment", OPERATOR)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not find(docs, "StatefulSet")
    env = env_of(deployment["spec"]["template"]["spec"])
    assert env["CREWFENCE_OPERATOR_STANDALONE"] == "true"
    assert "CREWFENCE_OPERATOR_PRIORITY" not in env
    assert not find(docs, "ClusterKopfPeering")


def test_several_replicas_peer_with_distinct_priorities(helm: Helm) -> None:
    docs = helm.render({"replicaCount": 3})
    assert not find(docs, "Deployment")
    sts = one(docs, "StatefulSet", OPERATOR)
    assert sts["spec"]["replicas"] == 3
    env = env_of(sts["spec"]["template"]["spec"])
    assert env["CREWFENCE_OPERATOR_STANDALONE"] == "false"
    # The ordinal is unique per StatefulSet pod, so no two peers share a priority.
    assert env["CREWFENCE_OPERATOR_PRIORITY"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    assert env["CREWFENCE_OPERATOR_PEERING"] == "crewfence"
    assert one(docs, "ClusterKopfPeering", "crewfence")
    assert one(docs, "CustomResourceDefinition", "clusterkopfpeerings.kopf.dev")
    rules = one(docs, "ClusterRole")["rules"]
    assert any("clusterkopfpeerings" in r["resources"] for r in rules)


def test_pod_security(helm: Helm) -> None:
    pod = one(helm.render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert (
        container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    )
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_sidecar_image_and_journal_bounds_reach_the_operator(helm: Helm) -> None:
    docs = helm.render(
        {
            "sidecar.image.repository": "registry.example/crews",
            "sidecar.image.tag": "7",
            "sidecar.journal.maxStateBytes": 5 * 1024**3,
            "sidecar.journal.maxRetainedRuns": 123,
        }
    )
    env = env_of(one(docs, "Deployment")["spec"]["template"]["spec"])
    assert env["CREWFENCE_OPERATOR_SIDECAR_IMAGE"] == "registry.example/crews:7"
    assert env["CREWFENCE_OPERATOR_SIDECAR_MAX_STATE_BYTES"] == str(5 * 1024**3)
    assert env["CREWFENCE_OPERATOR_SIDECAR_MAX_RETAINED_RUNS"] == "123"


def rule_triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.mark.parametrize(
    "values",
    [{}, {"replicaCount": 2}, {"rbac.namespaced": True, "operator.watchNamespaces": ["a"]}],
)
def test_rbac_has_no_wildcards_and_secrets_only_where_needed(
    helm: Helm, values: dict[str, Any]
) -> None:
    docs = helm.render(values)
    for role in find(docs, "ClusterRole") + find(docs, "Role"):
        for group, resource, verb in rule_triples(role["rules"]):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            if resource == "secrets":
                # The operator creates each Crew's token Secret and reads it back to dispatch;
                # it never lists or watches Secrets.
                assert verb in {"get", "create", "patch", "delete"}, verb


def test_namespaced_rbac_grants_roles_only_in_watched_namespaces(helm: Helm) -> None:
    docs = helm.render({"rbac.namespaced": True, "operator.watchNamespaces": ["team-a", "team-b"]})
    roles = find(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = find(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
        ]
    cluster = rule_triples(one(docs, "ClusterRole")["rules"])
    assert not {t for t in cluster if t[1] in {"pods", "secrets", "crewjobs"}}
    env = env_of(one(docs, "Deployment")["spec"]["template"]["spec"])
    assert env["CREWFENCE_OPERATOR_NAMESPACES"] == "team-a,team-b"
    assert env["CREWFENCE_OPERATOR_ALL_NAMESPACES"] == "false"


def test_namespaced_rbac_needs_namespaces(helm: Helm) -> None:
    result = helm.run(
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        helm.kube_version,
        "--set",
        "rbac.namespaced=true",
        check=False,
    )
    assert result.returncode != 0
    assert "watchNamespaces" in result.stderr


def load_cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_generated_webhook_certificate_matches_ca_bundle(helm: Helm) -> None:
    docs = helm.render()
    secret = one(docs, "Secret", f"{WEBHOOK}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    vwc = one(docs, "ValidatingWebhookConfiguration")
    assert {w["name"] for w in vwc["webhooks"]} == {
        "validate-crew.crewfence.dev",
        "validate-pod.crewfence.dev",
    }
    for hook in vwc["webhooks"]:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem
        assert hook["clientConfig"]["service"] == {
            "name": WEBHOOK,
            "namespace": NAMESPACE,
            "path": hook["clientConfig"]["service"]["path"],
            "port": 443,
        }
        assert "url" not in hook["clientConfig"]
    ca = load_cert(ca_pem)
    leaf = load_cert(base64.b64decode(secret["data"]["tls.crt"]))
    assert leaf.issuer == ca.subject
    key = ca.public_key()
    assert leaf.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(
            leaf.signature,
            leaf.tbs_certificate_bytes,
            padding.PKCS1v15(),
            leaf.signature_hash_algorithm,
        )
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(
            leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm)
        )
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{WEBHOOK}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    not_after = dt.datetime.fromisoformat(
        secret["metadata"]["annotations"]["crewfence.dev/not-after"]
    )
    assert abs((not_after - leaf.not_valid_after_utc).total_seconds()) < 3600
    # The pod restarts when the certificate changes (the operator loads it at start).
    pod = one(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"]["checksum/webhook-tls"]


def test_webhook_service_reaches_the_operator_port(helm: Helm) -> None:
    docs = helm.render()
    service = one(docs, "Service", WEBHOOK)
    pod = one(docs, "Deployment")["spec"]["template"]
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    assert any(
        p["name"] == "webhook" and p["containerPort"] == 9443
        for p in pod["spec"]["containers"][0]["ports"]
    )
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    env = env_of(pod["spec"])
    assert env["CREWFENCE_OPERATOR_WEBHOOK_MODE"] == "service"
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert env["CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR"] in mounts


def test_cert_manager_mode(helm: Helm) -> None:
    docs = helm.render({"webhook.certManager.enabled": True})
    cert = one(docs, "Certificate", WEBHOOK)
    assert cert["spec"]["secretName"] == f"{WEBHOOK}-tls"
    assert one(docs, "Issuer")["spec"] == {"selfSigned": {}}
    assert not find(docs, "Secret", f"{WEBHOOK}-tls")
    vwc = one(docs, "ValidatingWebhookConfiguration")
    assert (
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{WEBHOOK}"
    )
    assert all("caBundle" not in w["clientConfig"] for w in vwc["webhooks"])
    external = helm.render(
        {
            "webhook.certManager.enabled": True,
            "webhook.certManager.issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
        }
    )
    assert not find(external, "Issuer")
    assert one(external, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
    }


def test_network_policy_admits_only_the_operator_to_the_sidecar_port(helm: Helm) -> None:
    docs = helm.render({"operator.watchNamespaces": ["team-a", "team-b"]})
    policies = find(docs, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    operator_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for policy in policies:
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "crewfence"}
        assert spec["podSelector"]["matchExpressions"] == [
            {"key": "crewfence.dev/crew", "operator": "Exists"}
        ]
        assert spec["policyTypes"] == ["Ingress"]
        [rule] = spec["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 8090}]
        [peer] = rule["from"]
        assert peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
        }
        assert peer["podSelector"]["matchLabels"].items() <= operator_labels.items()


def test_monitors_are_optional(helm: Helm) -> None:
    assert not find(helm.render(), "ServiceMonitor")
    docs = helm.render({"metrics.serviceMonitor.enabled": True, "metrics.podMonitor.enabled": True})
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service", f"{OPERATOR}-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    pod_monitor = one(docs, "PodMonitor")
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"


def test_grafana_dashboard_configmap(helm: Helm) -> None:
    cm = one(helm.render(), "ConfigMap", f"{RELEASE}-crewfence-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART / "files" / "dashboards" / "crewfence.json").read_text()
    assert json.loads(cm["data"]["crewfence.json"]) == json.loads(shipped)


def test_argocd_health_checks_are_opt_in(helm: Helm) -> None:
    assert not find(helm.render(), "Job")
    docs = helm.render({"argocd.installHealthChecks": True})
    cm = one(docs, "ConfigMap", f"{RELEASE}-crewfence-argocd-health")
    argo = CHART / "files" / "argocd"
    assert cm["data"] == {
        "resource.customizations.health.crewfence.dev_CrewJob": (argo / "crewjob-health.lua")
        .read_text()
        .rstrip("\n"),
        "resource.customizations.health.crewfence.dev_Crew": (argo / "crew-health.lua")
        .read_text()
        .rstrip("\n"),
    }
    job = one(docs, "Job")
    assert "post-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    role = one(docs, "Role", f"{RELEASE}-crewfence-argocd-health")
    assert role["metadata"]["namespace"] == "argocd"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["argocd-cm"],
            "verbs": ["get", "patch"],
        }
    ]


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": 0},
        {"securityContext.readOnlyRootFilesystem": False},
        {"podSecurityContext.runAsNonRoot": False},
        {"sidecar.journal.maxStateBytes": 1},
        {"webhook.failurePolicy": "Sometimes"},
        {"unknownTopLevelKey": 1},
    ],
)
def test_values_schema_rejects(helm: Helm, values: dict[str, Any]) -> None:
    key, value = next(iter(values.items()))
    result = helm.run(
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        helm.kube_version,
        "--set-json",
        f"{key}={json.dumps(value)}",
        check=False,
    )
    assert result.returncode != 0
    assert "schema" in result.stderr.lower() or "values don't meet" in result.stderr.lower()
