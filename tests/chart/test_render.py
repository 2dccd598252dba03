"""What `helm template` renders, object by object (schemas: tests/e2e/test_chart_validate.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chart_helpers import CHART, NAMESPACE, RELEASE, Helm, find, one

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
    rules = one(docs, "ClusterRole", f"{OPERATOR}-cluster")["rules"]
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
        for rule in role["rules"]:
            for group, resource, verb in rule_triples([rule]):
                assert "*" not in (group, resource, verb), role["metadata"]["name"]
                if resource == "secrets":
                    # The operator creates each Crew's token Secret and reads it back to
                    # dispatch; it never lists or watches Secrets.
                    assert verb in {"get", "create", "patch", "delete", "update"}, verb


def test_namespaced_rbac_grants_roles_only_in_watched_namespaces(helm: Helm) -> None:
    docs = helm.render({"rbac.namespaced": True, "operator.watchNamespaces": ["team-a", "team-b"]})
    roles = find(docs, "Role", OPERATOR)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = find(docs, "RoleBinding", OPERATOR)
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
        ]
    cluster = rule_triples(one(docs, "ClusterRole", f"{OPERATOR}-cluster")["rules"])
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


def test_chart_renders_no_certificate_the_operator_keeps_it(helm: Helm) -> None:
    docs = helm.render()
    assert not find(docs, "Secret", f"{WEBHOOK}-tls")
    vwc = one(docs, "ValidatingWebhookConfiguration")
    assert {w["name"] for w in vwc["webhooks"]} == {
        "validate-crew.crewfence.dev",
        "validate-pod.crewfence.dev",
    }
    for hook in vwc["webhooks"]:
        assert "caBundle" not in hook["clientConfig"]  # the operator injects it
        assert hook["clientConfig"]["service"] == {
            "name": WEBHOOK,
            "namespace": NAMESPACE,
            "path": hook["clientConfig"]["service"]["path"],
            "port": 443,
        }
        assert "url" not in hook["clientConfig"]
    pod = one(docs, "Deployment")["spec"]["template"]
    assert "checksum/webhook-tls" not in (pod["metadata"].get("annotations") or {})
    env = env_of(pod["spec"])
    assert env["CREWFENCE_OPERATOR_WEBHOOK_TLS_SECRET"] == f"{NAMESPACE}/{WEBHOOK}-tls"
    assert env["CREWFENCE_OPERATOR_WEBHOOK_CONFIGURATION"] == vwc["metadata"]["name"]
    assert env["CREWFENCE_OPERATOR_WEBHOOK_SERVICE"] == WEBHOOK


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
    assert env["CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR"].startswith("/tmp/") and "/tmp" in mounts


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
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    env = env_of(pod)
    assert "CREWFENCE_OPERATOR_WEBHOOK_TLS_SECRET" not in env
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert env["CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR"] in mounts
    assert not find(docs, "Role", f"{OPERATOR}-webhook-tls")
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
    policies = [p for p in find(docs, "NetworkPolicy")
                if p["metadata"]["name"].endswith("-sidecars")]
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
        "resource.customizations.health.crewfence.dev_CrewCronJob": (
            argo / "crewcronjob-health.lua").read_text().rstrip("\n"),
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
