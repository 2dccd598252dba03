"""Closing the loop on an uncertain outcome, on the real control plane: the API server's CEL
rules, the operator's resolution and supersedes gate, the sidecar's journal, the kubectl plugin
run by kubectl itself, the gauge and the alert expression over live scrapes, and the Argo CD and
Flux health checks over the live objects.

Uncertain outcomes are produced the way users rehearse them: the pod of a running
``[[sleep:N]]`` job is killed (``SidecarRestarted``, uncertain; the journal survives on its
claim, so the resolution can be journaled there).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from crewjob_support import (
    REPO,
    apply_obj,
    condition,
    crew_access,
    crew_replicas,
    crew_token,
    crewjob_manifest,
    events_for,
    get_job,
    metric_total,
    research_crew,
    sidecar_get,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator
from plugin_support import kubectl_plugin, plugin_dir

pytestmark = pytest.mark.slow

UNSURE_INPUT = {"topic": "[[sleep:8]] unsure"}
ARGO_LUA = REPO / "charts" / "crewfence" / "files" / "argocd" / "crewjob-health.lua"


# --- helpers ----------------------------------------------------------------------------------
def patch_resolution(cluster: Cluster, ns: str, name: str, outcome: str,
                     note: str) -> subprocess.CompletedProcess[str]:
    body = {"spec": {"resolution": {"outcome": outcome, "note": note}}}
    return cluster.kubectl("patch", "crewjob", name, "-n", ns, "--type=merge", "-p",
                           json.dumps(body))


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels-text: value}`` of every sample of ``name``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line.strip())
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def rule_fires(expr: str, text: str) -> dict[str, float]:
    """Evaluate the chart's alert expression, ``max by (namespace) (METRIC) > N``, over one
    live scrape: ``{namespace: value}`` of the series that would fire."""
    m = re.fullmatch(r"\s*max by \(namespace\) \((\w+)\) > (\d+)\s*", expr)
    assert m, f"the rule changed shape; update this evaluator: {expr}"
    metric, threshold = m.group(1), float(m.group(2))
    per_ns: dict[str, float] = {}
    for labels, value in samples(text, metric).items():
        ns = re.search(r'namespace="([^"]*)"', labels)
        key = ns.group(1) if ns else ""
        per_ns[key] = max(value, per_ns.get(key, value))
    return {ns: v for ns, v in per_ns.items() if v > threshold}


def argo_health(obj: dict[str, Any]) -> str:
    lupa = pytest.importorskip("lupa.lua51")
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(ARGO_LUA.read_text())
    return str(hs["status"])


def flux_health(obj: dict[str, Any]) -> str:
    sys.path.insert(0, str(REPO / "tests" / "gitops"))
    try:
        from test_flux_health_exprs import flux_status
    finally:
        sys.path.remove(str(REPO / "tests" / "gitops"))
    return str(flux_status("CrewJob", obj))


def sidecar_events(cluster: Cluster, ns: str, action_id: str) -> list[dict[str, Any]]:
    access = crew_access(cluster, ns, "research")
    (rep,) = [r for r in crew_replicas(cluster, ns, "research") if r.get("address")]
    code, text = sidecar_get(rep, f"/jobs/{quote(action_id, safe='')}/events", access)
    assert code == 200, text
    return list(json.loads(text)["events"])


def admissions(cluster: Cluster, ns: str) -> float:
    access = crew_access(cluster, ns, "research")
    (rep,) = [r for r in crew_replicas(cluster, ns, "research") if r.get("address")]
    _, text = sidecar_get(rep, "/metrics", access)
    return metric_total(text, "crewfence_sidecar_admissions_total")


def make_uncertain(cluster: Cluster, ns: str, names: tuple[str, ...]) -> None:
    """Run the jobs, kill their (only) replica's pod while they run: uncertain outcomes."""
    for name in names:
        assert apply_obj(cluster, crewjob_manifest(name, "run", UNSURE_INPUT, timeoutMs=600000),
                         ns).returncode == 0
    pods = {wait_phase(cluster, ns, n, ("Running",), timeout=180)["status"]["assignment"]["pod"]
            for n in names}
    for pod in pods:
        cluster.kubectl("delete", "pod", pod, "-n", ns, "--force", "--grace-period=0",
                        check=True)
    for name in names:
        obj = wait_phase(cluster, ns, name, timeout=300)
        assert obj["status"]["uncertainOutcome"] is True, json.dumps(obj["status"])
    wait_crew_ready(cluster, ns, "research", 1)


def wait_status(cluster: Cluster, ns: str, name: str, check: Any, what: str,
                timeout: float = 90) -> dict[str, Any]:
    def look() -> dict[str, Any] | None:
        obj = get_job(cluster, ns, name)
        return obj if obj is not None and check(obj.get("status") or {}) else None

    try:
        found: dict[str, Any] = wait_for(look, timeout=timeout, what=what)
    except AssertionError as exc:
        last = (get_job(cluster, ns, name) or {}).get("status")
        raise AssertionError(f"{exc}; last status: {json.dumps(last)}") from None
    return found


# --- the walk -------------------------------------------------------------------------------------
@pytest.fixture
def ns(cluster: Cluster, operator_process: Operator, namespace: str) -> str:
    assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 1)
    return namespace


def test_resolve_supersede_and_see_it_everywhere(cluster: Cluster, ns: str, tmp_path: Path,
                                                 operator_process: Operator) -> None:
    plugin = plugin_dir(tmp_path)
    assert apply_obj(cluster, crewjob_manifest("sure", "run", {"topic": "bees"}),
                     ns).returncode == 0
    assert wait_phase(cluster, ns, "sure")["status"]["phase"] == "Succeeded"
    make_uncertain(cluster, ns, ("unsure", "unsure-b"))

    # A resolution on a known outcome: refused by the API server, with the reason.
    refused = patch_resolution(cluster, ns, "sure", "NotHappened", "it did not")
    assert refused.returncode != 0
    assert "only be set on a CrewJob whose outcome is uncertain" in refused.stderr

    # The gauge and the alert expression see both unresolved outcomes.
    text = scrape(operator_process.metrics_url)
    gauge = samples(text, "crewfence_operator_unresolved_uncertain_crewjobs")
    assert sum(v for k, v in gauge.items() if f'namespace="{ns}"' in k) == 2, gauge
    helm = cluster.helm("template", "t", str(REPO / "charts" / "crewfence"),
                        "--set", "metrics.prometheusRule.enabled=true",
                        "--set", "metrics.prometheusRule.unresolvedAfterSeconds=1",
                        "--show-only", "templates/prometheusrule.yaml")
    assert helm.returncode == 0, helm.stderr
    expr = yaml.safe_load(helm.stdout)["spec"]["groups"][0]["rules"][0]["expr"]
    wait_for(lambda: ns in rule_fires(expr, scrape(operator_process.metrics_url)),
             timeout=30, what="the alert expression to fire for the namespace")

    # The plugin, run by kubectl: uncertain lists both, oldest first, with reason and replica.
    listed = kubectl_plugin(cluster, plugin, "uncertain", "-n", ns, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(r["name"] for r in rows) == ["unsure", "unsure-b"]
    assert {r["reason"] for r in rows} == {"SidecarRestarted"}
    assert all(r["replica"] == "research-0" for r in rows)
    explained = kubectl_plugin(cluster, plugin, "explain", "unsure", "-n", ns)
    assert explained.returncode == 0, explained.stderr
    assert "UNCERTAIN (SidecarRestarted)" in explained.stdout
    assert "failed (sidecar_restarted), outcome UNCERTAIN" in explained.stdout  # its record
    # ... asked the way the operator asks: mutual TLS, the replica's name verified
    assert "over mutual TLS with the Crew's client certificate, verified as " \
        f"research-0.research.{ns}.svc" in explained.stdout
    assert "Recovery advice" in explained.stdout

    # A successor of the unresolved job waits, Pending with the reason, and runs nothing.
    before = admissions(cluster, ns)
    successor = crewjob_manifest("unsure-next", "run", {"topic": "bees again"},
                                 supersedes="unsure")
    assert apply_obj(cluster, successor, ns).returncode == 0
    waiting = wait_status(cluster, ns, "unsure-next",
                          lambda s: s.get("reason") == "PredecessorUnresolved",
                          "the successor to wait for its predecessor")
    assert waiting["status"]["phase"] == "Pending"
    assert "resolve it first" in waiting["status"]["message"]
    assert admissions(cluster, ns) == before

    # Resolve through the plugin (kubectl crewfence resolve).
    resolved = kubectl_plugin(cluster, plugin, "resolve", "unsure", "-n", ns, "--not-happened",
                              "--note", "no provider request in the logs",
                              "--evidence", "https://tickets.example/OPS-1")
    assert resolved.returncode == 0, resolved.stderr
    assert "resolved NotHappened" in resolved.stdout
    obj = wait_status(cluster, ns, "unsure",
                      lambda s: (s.get("resolution") or {}).get("journal", {}).get("state")
                      == "Journaled", "the resolution to be journaled")
    status = obj["status"]
    assert status["resolution"]["resolvedBy"] == "kubectl-crewfence"
    assert status["resolution"]["evidence"] == ["https://tickets.example/OPS-1"]
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == \
        ("Failed", "SidecarRestarted", True)  # a finding, not a rewrite of history
    uncertain = condition(obj, "OutcomeUncertain")
    assert uncertain is not None and (uncertain["status"], uncertain["reason"]) == \
        ("False", "Resolved")
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert any(e.get("type") == "Normal" and e.get("reason") == "Resolved"
               for e in events_for(cluster, ns, "unsure"))
    journaled = [e for e in sidecar_events(cluster, ns, f"{ns}/unsure")
                 if e["event"] == "resolution"]
    assert len(journaled) == 1
    assert journaled[0]["sequence"] == status["resolution"]["journal"]["sequence"]
    assert journaled[0]["data"]["outcome"] == "NotHappened"
    assert journaled[0]["data"]["resolved_by"] == "kubectl-crewfence"

    # A second resolution is rejected by the API server.
    second = patch_resolution(cluster, ns, "unsure", "Happened", "changed my mind")
    assert second.returncode != 0
    assert "can be set only once" in second.stderr

    # Resolve the other one through kubectl patch: who is the field manager.
    assert patch_resolution(cluster, ns, "unsure-b", "Happened", "the mail went out")\
        .returncode == 0
    obj_b = wait_status(cluster, ns, "unsure-b",
                        lambda s: (s.get("resolution") or {}).get("outcome") == "Happened",
                        "the patched resolution to be accepted")
    assert obj_b["status"]["resolution"]["resolvedBy"] == "kubectl-patch"

    # The successor is admitted now, runs exactly once, and the two link to each other.
    done = wait_phase(cluster, ns, "unsure-next")
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"])
    assert done["status"]["supersedes"]["name"] == "unsure"
    assert done["status"]["actionId"] == f"{ns}/unsure-next"
    pred = get_job(cluster, ns, "unsure") or {}
    assert pred["status"]["supersededBy"] == {"name": "unsure-next",
                                              "actionId": f"{ns}/unsure-next"}
    assert admissions(cluster, ns) == before + 1
    # One successor per predecessor: another is refused, and so is a rerun.
    assert apply_obj(cluster, crewjob_manifest("unsure-again", "run", {"topic": "x"},
                                               supersedes="unsure"), ns).returncode == 0
    again = wait_phase(cluster, ns, "unsure-again")
    assert again["status"]["failure"]["code"] == "already_superseded"
    rerun = kubectl_plugin(cluster, plugin, "rerun", "unsure", "-n", ns)
    assert rerun.returncode == 1 and "already superseded" in rerun.stderr
    # a job resolved Happened is never rerun
    rerun_b = kubectl_plugin(cluster, plugin, "rerun", "unsure-b", "-n", ns)
    assert rerun_b.returncode == 1 and "Happened" in rerun_b.stderr
    assert admissions(cluster, ns) == before + 1

    # Seen where people look: the gauge and the alert drop, the health checks settle.
    text = scrape(operator_process.metrics_url)
    gauge = samples(text, "crewfence_operator_unresolved_uncertain_crewjobs")
    assert sum(v for k, v in gauge.items() if f'namespace="{ns}"' in k) == 0, gauge
    assert ns not in rule_fires(expr, text)
    after = get_job(cluster, ns, "unsure") or {}
    assert argo_health(after) == "Suspended"
    assert argo_health(get_job(cluster, ns, "unsure-b") or {}) == "Healthy"
    assert flux_health(after) == "Current"
    listed = kubectl_plugin(cluster, plugin, "uncertain", "-n", ns, "-o", "json")
    assert json.loads(listed.stdout) == []


def test_rerun_through_the_plugin_runs_the_successor_once(
        cluster: Cluster, ns: str, tmp_path: Path) -> None:
    plugin = plugin_dir(tmp_path)
    make_uncertain(cluster, ns, ("flaky",))
    early = kubectl_plugin(cluster, plugin, "rerun", "flaky", "-n", ns)
    assert early.returncode == 1 and "unresolved" in early.stderr
    assert kubectl_plugin(cluster, plugin, "resolve", "flaky", "-n", ns, "--compensated",
                          "--note", "refunded by OPS-2").returncode == 0
    before = admissions(cluster, ns)
    made = kubectl_plugin(cluster, plugin, "rerun", "flaky", "-n", ns)
    assert made.returncode == 0, made.stderr
    assert "flaky-rerun" in made.stdout
    twice = kubectl_plugin(cluster, plugin, "rerun", "flaky", "-n", ns)
    assert twice.returncode == 1 and "already" in twice.stderr
    successor = wait_phase(cluster, ns, "flaky-rerun")
    assert successor["spec"]["supersedes"] == "flaky"
    assert successor["spec"]["timeoutMs"] == 600000  # the original spec, a new action id
    assert successor["status"]["phase"] == "Succeeded"
    assert successor["status"]["actionId"] == f"{ns}/flaky-rerun"
    assert admissions(cluster, ns) == before + 1


def _grant(cluster: Cluster, ns: str, account: str, rules: list[dict[str, Any]]) -> None:
    """Role + RoleBinding ``<account>`` in ``ns``: exactly ``rules`` for that ServiceAccount."""
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": account, "namespace": ns}, "rules": rules})
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": account, "namespace": ns},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": account},
                   "subjects": [{"kind": "ServiceAccount", "name": account,
                                 "namespace": ns}]})


def test_explain_asks_the_sidecar_over_mutual_tls_or_says_why_not(
        cluster: Cluster, ns: str, tmp_path: Path) -> None:
    """``kubectl crewfence explain`` reads the Crew's token and CA with the user's own
    credentials and asks the replica over mutual TLS, verifying its name; a user who may read
    the CrewJob and the Crew but not a Secret gets one line naming that Secret and the
    status-side evidence. No token or key is ever printed."""
    plugin = plugin_dir(tmp_path)
    assert apply_obj(cluster, crewjob_manifest("told", "run", {"topic": "bees"}),
                     ns).returncode == 0
    assert wait_phase(cluster, ns, "told")["status"]["phase"] == "Succeeded"
    admin = kubectl_plugin(cluster, plugin, "explain", "told", "-n", ns)
    assert admin.returncode == 0, admin.stderr
    assert "over mutual TLS with the Crew's client certificate, verified as " \
        f"research-0.research.{ns}.svc" in admin.stdout
    assert "#0 started" in admin.stdout and "status completed" in admin.stdout
    as_json = kubectl_plugin(cluster, plugin, "explain", "told", "-n", ns, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["sidecar"]["record"]["status"] == "completed"

    # A reader of CrewJobs and Crews, without any Secret.
    account = "evidence-reader"
    cluster.kubectl("create", "serviceaccount", account, "-n", ns, check=True)
    reads = {"apiGroups": ["crewfence.dev"], "resources": ["crewjobs", "crews"],
             "verbs": ["get", "list"]}
    _grant(cluster, ns, account, [reads])
    kubeconfig = cluster.service_account_kubeconfig(ns, account, tmp_path / "reader.kubeconfig")

    def explain_as_reader(secret: str) -> subprocess.CompletedProcess[str]:
        def refused_once() -> subprocess.CompletedProcess[str] | None:
            out = kubectl_plugin(cluster, plugin, "explain", "told", "-n", ns,
                                 kubeconfig=kubeconfig)
            return out if f"Secret {ns}/{secret} (403" in out.stdout else None

        found: subprocess.CompletedProcess[str] = wait_for(
            refused_once, timeout=30, what=f"explain to name {secret} as not readable")
        return found

    no_secrets = explain_as_reader("research-crewfence-token")
    # ... and with the token but no TLS Secret: the client-certificate Secret is named.
    token_rule = {"apiGroups": [""], "resources": ["secrets"],
                  "resourceNames": ["research-crewfence-token"], "verbs": ["get"]}
    _grant(cluster, ns, account, [reads, token_rule])
    no_ca = explain_as_reader("research-crewfence-operator-client")
    for out in (no_secrets, no_ca):
        assert out.returncode == 0, out.stderr
        refused = [line for line in out.stdout.splitlines() if "you may not read" in line]
        assert len(refused) == 1, out.stdout
        assert "showing the CrewJob's own status only" in refused[0]
        assert "The outcome is known." in out.stdout and "Request hash" in out.stdout
        assert "status completed" not in out.stdout  # the sidecar was not asked

    # With the token and the client-certificate Secret (which holds no CA key), but never
    # the CA Secret: the sidecar is asked over mutual TLS.
    client_secret = cluster.get_json("secret", "research-crewfence-operator-client", "-n", ns)
    assert set(client_secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    _grant(cluster, ns, account, [reads, {**token_rule, "resourceNames": [
        "research-crewfence-token", "research-crewfence-operator-client"]}])

    def asked_as_reader() -> subprocess.CompletedProcess[str] | None:
        out = kubectl_plugin(cluster, plugin, "explain", "told", "-n", ns,
                             kubeconfig=kubeconfig)
        return out if "status completed" in out.stdout else None

    scoped = wait_for(asked_as_reader, timeout=30, what="explain with the client Secret only")
    assert "over mutual TLS with the Crew's client certificate" in scoped.stdout

    token = crew_token(cluster, ns, "research")
    ca_secret = cluster.get_json("secret", "research-crewfence-ca", "-n", ns)
    for out in (admin, as_json, no_secrets, no_ca, scoped):
        printed = out.stdout + out.stderr
        assert token not in printed and "PRIVATE KEY" not in printed
        assert ca_secret["data"]["ca.key"] not in printed
        assert client_secret["data"]["tls.key"] not in printed
