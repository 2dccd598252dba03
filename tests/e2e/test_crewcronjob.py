"""CrewCronJob on the real control plane, with the operator running under exactly its RBAC:
exactly one Action per tick through SIGKILLed operators (between ticks and while a tick is
being admitted), a child deleted by hand (never run again), Forbid with a slow job, a manual
trigger, onUncertain Pause after a SIGKILLed sidecar, and bad input refused by the API server
or reported as a condition."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from crewfence_operator import rbac
from crewfence_operator.cronjob import children as ch
from crewfence_operator.cronjob.schedule import from_rfc3339, to_rfc3339
from crewfence_operator.cronjob.trigger import trigger
from crewjob_support import (
    apply_obj,
    crew_access,
    crew_replicas,
    crewjob_namespace,
    metric_total,
    research_crew,
    service_account_with_rules,
    sidecar_get,
    sidecar_record,
    wait_crew_ready,
    wait_for,
)
from harness.handles import Cluster, Operator, PodRunner

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

_module: dict[str, Any] = {}


@pytest.fixture(scope="module")
def _stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack
    _module.clear()


@pytest.fixture
def op(cluster: Cluster, operator_factory: Callable[..., Operator], _operators: list[Operator],
       _stack: ExitStack) -> Operator:
    """The operator with exactly ``rbac.rules()`` (a real ServiceAccount token)."""
    if "account" not in _module:
        _module["account"] = _stack.enter_context(service_account_with_rules(
            cluster, "ccj-rbac", rbac.rules(managed_webhook=True)))
    current = _operators[0] if _operators else None
    if current is not None and current.service_account == _module["account"] and \
            current.alive():
        return current
    return operator_factory(service_account=_module["account"])


@pytest.fixture
def ns(cluster: Cluster, op: Operator, _stack: ExitStack) -> str:
    """One namespace and one Crew (1 replica) for the whole module."""
    if "ns" not in _module:
        name = _stack.enter_context(crewjob_namespace(cluster, "e2e-ccj"))
        assert apply_obj(cluster, research_crew(1), name).returncode == 0
        wait_crew_ready(cluster, name, "research", 1)
        # Runs first at teardown: the operator (still with its rights) removes the finalizers.
        _stack.callback(cluster.kubectl, "delete", "crewcronjobs", "--all", "-n", name,
                        "--wait=true", "--timeout=60s")
        _module["ns"] = name
    return str(_module["ns"])


def cronjob(name: str, topic: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewCronJob",
            "metadata": {"name": name},
            "spec": {"jobTemplate": {"spec": {"crewRef": {"name": "research"},
                                              "operation": "run", "input": {"topic": topic}}},
                     **spec}}


def children_of(cluster: Cluster, ns: str, name: str) -> dict[str, dict[str, Any]]:
    found = cluster.get_json("crewjobs", "-n", ns, "-l", f"{ch.LABEL_CRONJOB}={name}")
    return {i["metadata"]["name"]: i for i in (found or {}).get("items") or []}


def get_ccj(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.get_json("crewcronjob", name, "-n", ns)
    return obj


def cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return {}


def admissions(cluster: Cluster, ns: str) -> float:
    (rep,) = [r for r in crew_replicas(cluster, ns, "research") if r.get("address")]
    _, text = sidecar_get(rep, "/metrics", crew_access(cluster, ns, "research"))
    return metric_total(text, "crewfence_sidecar_admissions_total")


def wait_clock(moment: float) -> None:
    wait_for(lambda: time.time() >= moment, timeout=max(5.0, moment - time.time() + 5),
             what=f"the clock to pass {to_rfc3339(int(moment))}", interval=0.2)


def argo_and_flux(obj: dict[str, Any]) -> tuple[str, str]:
    """The chart's Lua (real Lua 5.1) and the documented Flux CEL over a live object."""
    lupa = pytest.importorskip("lupa.lua51")
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute((REPO / "charts/crewfence/files/argocd/crewcronjob-health.lua").read_text())
    sys.path.insert(0, str(REPO / "tests" / "gitops"))
    try:
        from test_flux_health_exprs import flux_status
    finally:
        sys.path.remove(str(REPO / "tests" / "gitops"))
    return str(hs["status"]), str(flux_status("CrewCronJob", obj))


def phase(obj: dict[str, Any]) -> str | None:
    return (obj.get("status") or {}).get("phase")


EVERY = 10  # seconds: the smallest interval the CRD allows keeps this file's wall time short


def test_one_action_per_tick_through_operator_kills_and_a_deleted_child(
        cluster: Cluster, ns: str, op: Operator) -> None:
    before = admissions(cluster, ns)
    assert apply_obj(cluster, cronjob("every", "tick", interval=f"{EVERY}s"),
                     ns).returncode == 0
    first = wait_for(lambda: children_of(cluster, ns, "every"), timeout=45,
                     what="the first tick's CrewJob")
    (t0,) = [from_rfc3339(c["metadata"]["annotations"][ch.ANNOTATION_SCHEDULED])
             for c in first.values()]
    # SIGKILL between ticks; the next tick passes while the operator is down: caught up.
    op.kill()
    wait_clock(t0 + EVERY + 1)
    op.start()
    wait_for(lambda: ch.child_name("every", t0 + EVERY) in children_of(cluster, ns, "every"),
             timeout=40, what="the tick missed while the operator was down, caught up")
    # SIGKILL while a tick is being admitted: the moment its CrewJob appears.
    wait_for(lambda: ch.child_name("every", t0 + 2 * EVERY) in children_of(cluster, ns, "every"),
             timeout=40, what="the third tick's CrewJob", interval=0.1)
    op.kill()
    op.start()
    expected = [ch.child_name("every", t0 + EVERY * i) for i in range(3)]

    def three_done() -> dict[str, dict[str, Any]] | None:
        kids = children_of(cluster, ns, "every")
        done = all(phase(kids.get(n, {})) == "Succeeded" for n in expected)
        return kids if done else None

    kids = wait_for(three_done, timeout=90, what="three ticks Succeeded")
    # A child of a tick that already ran, deleted by hand, is never created again.
    cluster.kubectl("delete", "crewjob", expected[0], "-n", ns, "--wait=true", check=True)
    last_before = from_rfc3339(get_ccj(cluster, ns, "every")["status"]["lastScheduleTime"])
    wait_for(lambda: from_rfc3339(get_ccj(cluster, ns, "every")["status"]
                                  ["lastScheduleTime"]) >= last_before + EVERY,
             timeout=40, what="one more tick after the deletion")
    cluster.kubectl("patch", "crewcronjob", "every", "-n", ns, "--type=merge",
                    "-p", '{"spec": {"suspend": true}}', check=True)
    wait_for(lambda: cond(get_ccj(cluster, ns, "every"), "Suspended").get("status") == "True",
             timeout=30, what="Suspended=True")
    assert argo_and_flux(get_ccj(cluster, ns, "every")) == ("Suspended", "Current")
    kids = children_of(cluster, ns, "every")
    assert expected[0] not in kids
    ticks = sorted(from_rfc3339(c["metadata"]["annotations"][ch.ANNOTATION_SCHEDULED])
                   for c in kids.values())
    assert ticks == list(range(t0 + EVERY, ticks[-1] + 1, EVERY)), ticks  # none lost, none twice
    for child in kids.values():
        tick = from_rfc3339(child["metadata"]["annotations"][ch.ANNOTATION_SCHEDULED])
        assert child["spec"]["actionId"] == f"{ns}/every/{to_rfc3339(tick)}"
        [ref] = child["metadata"]["ownerReferences"]
        assert ref["controller"] is True and ref["kind"] == "CrewCronJob"
    wait_for(lambda: all(phase(c) in ("Succeeded", "Failed", "Cancelled")
                         for c in children_of(cluster, ns, "every").values()),
             timeout=60, what="every child finished")
    # Exactly one admission per tick at the sidecar (the deleted child's included).
    assert admissions(cluster, ns) - before == len(ticks) + 1
    code, record = sidecar_record(cluster, ns, "research", 0,
                                  f"{ns}/every/{to_rfc3339(t0)}")
    assert code == 200 and record is not None and record["status"] == "completed"
    status = get_ccj(cluster, ns, "every")["status"]
    assert status["missedTicks"] == 0 and cond(get_ccj(cluster, ns, "every"),
                                               "Ready")["status"] == "True"
    printed = cluster.kubectl("get", "crewcronjob", "every", "-n", ns, check=True).stdout
    assert f"{EVERY}s" in printed.splitlines()[1] and "true" in printed.splitlines()[1]
    cluster.kubectl("delete", "crewcronjob", "every", "-n", ns, "--wait=true", check=True)


def test_forbid_skips_ticks_while_a_slow_job_runs_and_trigger_runs_once(
        cluster: Cluster, ns: str, op: Operator) -> None:
    # two tasks, each model call sleeps 7 s: a run outlasts the 10 s interval
    manifest = cronjob("forbid", "[[sleep:7]] slow", interval="10s", concurrencyPolicy="Forbid")
    assert apply_obj(cluster, manifest, ns).returncode == 0
    first = wait_for(lambda: children_of(cluster, ns, "forbid"), timeout=30,
                     what="the first tick's CrewJob")

    def skipped_and_second() -> dict[str, Any] | None:
        obj = get_ccj(cluster, ns, "forbid")
        kids = children_of(cluster, ns, "forbid")
        return obj if len(kids) >= 2 and (obj.get("status") or {}).get("skippedTicks") else None

    obj = wait_for(skipped_and_second, timeout=60, what="a skipped tick, then a second run")
    kids = children_of(cluster, ns, "forbid")
    # never two at once: the second child was created only after the first had finished
    (name1,) = first
    times = sorted((k["metadata"]["creationTimestamp"], n) for n, k in kids.items())
    assert times[0][1] == name1
    finished = kids[name1]["status"].get("finishedAt")
    assert finished is not None and from_rfc3339(times[1][0]) >= int(from_rfc3339(finished))
    assert obj["status"]["skippedTicks"] >= 1
    cluster.kubectl("patch", "crewcronjob", "forbid", "-n", ns, "--type=merge",
                    "-p", '{"spec": {"suspend": true}}', check=True)
    # A manual run: its own name and action id, created once even when triggered twice.
    from kubernetes import client, config

    api = client.CustomObjectsApi(config.new_client_from_config(str(cluster.kubeconfig)))
    now = time.time()
    result = trigger(api, ns, "forbid", now=now)
    again = trigger(api, ns, "forbid", now=now)
    assert result.created and not again.created and again.name == result.name
    assert result.action_id.startswith(f"{ns}/forbid/manual-")
    manual = wait_for(lambda: (children_of(cluster, ns, "forbid").get(result.name, {})
                               .get("status") or {}).get("startedAt")
                      and children_of(cluster, ns, "forbid")[result.name],
                      timeout=60, what="the manual run to be admitted")
    assert manual["status"]["actionId"] == result.action_id
    assert ch.ANNOTATION_SCHEDULED not in manual["metadata"]["annotations"]
    cluster.kubectl("delete", "crewcronjob", "forbid", "-n", ns, "--wait=false", check=True)


@pytest.mark.parametrize(("spec", "message"), [
    ({"schedule": "every day"}, "5-field cron expression"),
    ({"schedule": "0 * * * * *"}, "5-field cron expression"),
    ({"interval": "5s"}, "between 10s and 8784h"),
    ({}, "exactly one of spec.schedule"),
    ({"schedule": "* * * * *", "interval": "60s"}, "exactly one of spec.schedule"),
    ({"schedule": "* * * * *", "timeZone": "not a zone"}, "IANA time zone name"),
])
def test_bad_input_is_refused_by_the_api_server(cluster: Cluster, namespace: str,
                                                spec: dict[str, Any], message: str) -> None:
    result = apply_obj(cluster, cronjob("bad", "x", **spec), namespace)
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split()), result.stderr


@pytest.mark.parametrize(("spec", "reason"), [
    ({"schedule": "61 * * * *"}, "InvalidSchedule"),
    ({"schedule": "0 9 * * *", "timeZone": "Mars/Olympus_Mons"}, "UnknownTimeZone"),
])
def test_what_cel_cannot_decide_is_a_condition(cluster: Cluster, ns: str, op: Operator,
                                               spec: dict[str, Any], reason: str) -> None:
    name = f"bad-{reason.lower()}"
    assert apply_obj(cluster, cronjob(name, "x", **spec), ns).returncode == 0
    obj = wait_for(lambda: (o := get_ccj(cluster, ns, name)) and cond(o, "Ready").get(
        "reason") == reason and o, timeout=30, what=f"Ready=False {reason}")
    assert cond(obj, "Ready")["status"] == "False" and cond(obj, "Stalled")["status"] == "True"
    assert argo_and_flux(obj) == ("Degraded", "Failed")
    assert children_of(cluster, ns, name) == {}
    cluster.kubectl("delete", "crewcronjob", name, "-n", ns, "--wait=false")


def test_uncertain_outcome_pauses_until_resolved(cluster: Cluster, ns: str, op: Operator,
                                                 pod_runner: PodRunner) -> None:
    manifest = cronjob("pause", "[[sleep:60]] unsure", interval="10s", concurrencyPolicy="Forbid")
    assert apply_obj(cluster, manifest, ns).returncode == 0

    def running_child() -> dict[str, Any] | None:
        kids = children_of(cluster, ns, "pause")
        return next((k for k in kids.values() if phase(k) == "Running"), None)

    child = wait_for(running_child, timeout=60, what="a running child")
    pod_runner.kill(ns, child["status"]["assignment"]["pod"])  # SIGKILL the sidecar
    name = child["metadata"]["name"]
    wait_for(lambda: (children_of(cluster, ns, "pause").get(name, {}).get("status") or {})
             .get("uncertainOutcome") is True, timeout=120, what="the child's uncertain outcome")
    paused = wait_for(lambda: (o := get_ccj(cluster, ns, "pause")) and cond(o, "Paused").get(
        "status") == "True" and o, timeout=30, what="Paused=True")
    assert name in cond(paused, "Paused")["message"]
    assert argo_and_flux(paused) == ("Degraded", "Failed")
    skipped = paused["status"].get("skippedTicks", 0)
    wait_for(lambda: get_ccj(cluster, ns, "pause")["status"].get("skippedTicks", 0) > skipped,
             timeout=30, what="a tick skipped while paused")
    assert list(children_of(cluster, ns, "pause")) == [name]  # nothing ran while paused
    wait_crew_ready(cluster, ns, "research", 1)
    body = {"spec": {"resolution": {"outcome": "NotHappened", "note": "checked: no report"}}}
    cluster.kubectl("patch", "crewjob", name, "-n", ns, "--type=merge", "-p", json.dumps(body),
                    check=True)
    wait_for(lambda: len(children_of(cluster, ns, "pause")) >= 2, timeout=60,
             what="a new tick once the outcome was resolved")
    resumed = get_ccj(cluster, ns, "pause")
    assert cond(resumed, "Paused")["status"] == "False"
    assert argo_and_flux(resumed) == ("Healthy", "Current")
    cluster.kubectl("delete", "crewcronjob", "pause", "-n", ns, "--wait=false")


def test_the_example_is_accepted_and_scheduled_in_its_time_zone(
        cluster: Cluster, ns: str, op: Operator) -> None:
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    path = REPO / "examples" / "crewcronjob-report.yaml"
    cluster.kubectl("apply", "-n", ns, "-f", str(path), check=True)
    obj = wait_for(lambda: (o := get_ccj(cluster, ns, "report")) and cond(o, "Ready").get(
        "status") == "True" and o, timeout=30, what="the example Ready")
    nxt = datetime.fromtimestamp(from_rfc3339(obj["status"]["nextScheduleTime"]), UTC)
    local = nxt.astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute, local.weekday() < 5) == (7, 30, True)
    assert argo_and_flux(obj) == ("Healthy", "Current")
    cluster.kubectl("delete", "-n", ns, "-f", str(path), "--wait=false", check=True)
