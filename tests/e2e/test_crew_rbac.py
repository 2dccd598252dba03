"""The operator with exactly the RBAC in crewfence_operator.rbac (a real ServiceAccount token):
it reconciles a Crew and serves the webhook, and nothing it does is forbidden."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from crewfence_operator import rbac
from crewjob_support import service_account_with_rules
from harness.handles import Cluster, Operator, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "crew-research.yaml"


@pytest.fixture
def operator_account(cluster: Cluster) -> Iterator[str]:
    with service_account_with_rules(cluster, "crewfence-rbac",
                                    rbac.rules(managed_webhook=True)) as account:
        yield account


def test_operator_works_with_exactly_its_rbac(
    cluster: Cluster, operator_factory: Callable[..., Operator], operator_account: str,
    namespace: str,
) -> None:
    # The account may not do more than the rules say (e.g. list Secrets).
    denied = cluster.kubectl("auth", "can-i", "list", "secrets", "-n", namespace,
                             as_sa=operator_account)
    assert denied.stdout.strip() == "no"
    log_path = cluster.state_dir / "logs" / "operator.log"
    offset = log_path.stat().st_size if log_path.exists() else 0  # earlier operators' lines
    operator = operator_factory(service_account=operator_account)
    crew = yaml.safe_load(EXAMPLE.read_text())
    crew["spec"]["replicas"] = 1
    crew["metadata"]["namespace"] = namespace
    cluster.apply(crew)
    wait_until(lambda: ((cluster.get_json("crew", "research", "-n", namespace) or {})
                        .get("status") or {}).get("readyReplicas") == 1,
               timeout=180, what="the Crew ready under the operator's own RBAC")
    rejected = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "peek", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}],
                 "volumes": [{"name": "s",
                              "persistentVolumeClaim": {"claimName": "research-state-0"}}]}}))
    assert rejected.returncode != 0 and '"research-state-0"' in rejected.stderr
    logs = operator.logs()[offset:]
    # An RBAC denial reads 'pods is forbidden: User "system:serviceaccount:<ns>:<name>" cannot
    # create resource ...' (other 403s, e.g. a namespace being terminated, are not RBAC).
    ns, _, name = operator_account.partition(":")
    user = f"system:serviceaccount:{ns}:{name}"
    denials = [line for line in logs.splitlines() if user in line or "cannot list" in line
               or "cannot watch" in line or "cannot patch" in line or "cannot create" in line]
    assert denials == [], denials[:5]
    assert "Not enough RBAC permissions" not in logs
