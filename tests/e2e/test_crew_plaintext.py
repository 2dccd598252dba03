"""Plain HTTP between the operator and the sidecars, on the real control plane, only because
it is asked for explicitly (``CREWFENCE_OPERATOR_SIDECAR_TLS=0``; mutual TLS is the default,
which every other e2e module runs): no CA and no TLS Secrets exist, the pods carry the token
the old way, a CrewJob still succeeds, and the sidecar answers plain HTTP (on the pod runner's
loopback addresses, where the sidecar needs no ``CREWFENCE_INSECURE_PLAINTEXT``)."""

from __future__ import annotations

import json
from collections.abc import Callable

from crewjob_support import (
    apply_obj,
    crew_access,
    crewjob_manifest,
    research_crew,
    sidecar_get,
    wait_crew_ready,
    wait_phase,
)
from harness.handles import Cluster, Operator

PLAINTEXT = {"CREWFENCE_OPERATOR_SIDECAR_TLS": "0"}


def test_plain_http_only_when_asked_for(cluster: Cluster,
                                        operator_factory: Callable[..., Operator],
                                        namespace: str) -> None:
    operator_factory(extra_env=PLAINTEXT)
    assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
    (replica,) = wait_crew_ready(cluster, namespace, "research", 1)

    secrets = {s["metadata"]["name"]
               for s in cluster.get_json("secrets", "-n", namespace)["items"]}
    assert "research-crewfence-token" in secrets
    assert not {"research-crewfence-ca", "research-0-crewfence-tls"} & secrets, secrets
    pod = cluster.get_json("pod", "research-0", "-n", namespace)
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "CREWFENCE_TLS_CERT_FILE" not in env
    assert env["CREWFENCE_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == \
        "research-crewfence-token"
    assert container["readinessProbe"]["httpGet"].get("scheme", "HTTP") == "HTTP"

    access = crew_access(cluster, namespace, "research")
    assert access.context is None  # no CA: the helpers speak plain HTTP, like the operator
    code, text = sidecar_get(replica, "/health", access)
    assert code == 200 and json.loads(text)["journal_id"] == replica["journalId"]

    assert apply_obj(cluster, crewjob_manifest("plain", "run", {"topic": "bees"}),
                     namespace).returncode == 0
    status = wait_phase(cluster, namespace, "plain")["status"]
    assert (status["phase"], status["uncertainOutcome"]) == ("Succeeded", False), \
        json.dumps(status)
