"""The local control plane is a real API server: readiness, version, RBAC, admission policy."""

from __future__ import annotations

import json
import subprocess

from harness.handles import Cluster, wait_until
from harness.versions import HELM_VERSION, KUBERNETES_VERSION


def test_api_server_is_ready(cluster: Cluster) -> None:
    result = cluster.kubectl("get", "--raw", "/readyz")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_server_and_tools_report_the_pinned_versions(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json", check=True).stdout)
    assert version["serverVersion"]["gitVersion"] == KUBERNETES_VERSION
    assert version["clientVersion"]["gitVersion"] == KUBERNETES_VERSION
    helm = cluster.helm("version", "--short", check=True).stdout
    assert helm.startswith(HELM_VERSION)


def test_rbac_applies_to_an_impersonated_service_account(cluster: Cluster, namespace: str) -> None:
    sa = f"{namespace}:reader"
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace, check=True)
    denied = cluster.kubectl("get", "configmaps", "-n", namespace, as_sa=sa)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    cluster.kubectl(
        "create",
        "role",
        "read-cm",
        "--verb=get,list",
        "--resource=configmaps",
        "-n",
        namespace,
        check=True,
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "read-cm",
        "--role=read-cm",
        f"--serviceaccount={namespace}:reader",
        "-n",
        namespace,
        check=True,
    )
    allowed = cluster.kubectl("get", "configmaps", "-n", namespace, as_sa=sa)
    assert allowed.returncode == 0, allowed.stderr
    # Still nothing beyond the role.
    assert cluster.kubectl("get", "secrets", "-n", namespace, as_sa=sa).returncode != 0


def test_validating_admission_policy_is_enforced(cluster: Cluster, namespace: str) -> None:
    name = f"deny-forbidden-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "!has(object.data) || !('forbidden' in object.data)",
                    "message": "no forbidden keys",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    cluster.apply(policy)
    cluster.apply(binding)
    try:
        bad = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "bad", "namespace": namespace},
            "data": {"forbidden": "x"},
        }

        # The policy's type checking and binding take a moment to be picked up.
        def rejected() -> bool:
            result = cluster.kubectl("create", "-f", "-", input=json.dumps(bad))
            if result.returncode == 0:
                cluster.kubectl("delete", "configmap", "bad", "-n", namespace)
                return False
            assert "no forbidden keys" in result.stderr, result.stderr
            return True

        wait_until(rejected, timeout=60, what="the admission policy to reject")
        good = dict(bad, metadata={"name": "good", "namespace": namespace}, data={"ok": "1"})
        cluster.kubectl("create", "-f", "-", input=json.dumps(good), check=True)
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", name)
        cluster.kubectl("delete", "validatingadmissionpolicy", name)


def test_service_account_token_kubeconfig_authenticates_as_that_account(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("create", "serviceaccount", "robot", "-n", namespace, check=True)
    path = cluster.state_dir / f"robot-{namespace}.kubeconfig"
    kubeconfig = cluster.service_account_kubeconfig(namespace, "robot", path)
    result = subprocess.run(
        [
            str(cluster.kube_bin / "kubectl"),
            f"--kubeconfig={kubeconfig}",
            "auth",
            "whoami",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    user = json.loads(result.stdout)["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{namespace}:robot"
    assert f"system:serviceaccounts:{namespace}" in user["groups"]
