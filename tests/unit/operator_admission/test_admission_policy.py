"""The state fence's ValidatingAdmissionPolicies, evaluated by a real CEL runtime
(cel-expr-python) the way kube-apiserver evaluates them: matchConditions first, then, once per
param (every Crew of the namespace), the variables in order and every validation; no Crew: the
binding's parameterNotFoundAction Allow. The e2e tests run the same files on kube-apiserver.

Also: the operator package's copy of the manifests is byte-identical to the chart's, and the
webhook/binding builders keep the namespace exclusions and matchConditions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cel_expr_python import cel
from crewfence_operator import admission
from crewfence_operator.crew.identity import CrewRef, owner_reference
from crewfence_operator.crew.pod import PodSettings, replica_pod
from crewfence_operator.crew.spec import parse_spec

REPO = Path(__file__).resolve().parents[3]
CHART_FILES = REPO / "charts" / "crewfence" / "files" / "admission"
ENV = cel.NewEnv(variables={name: cel.Type.DYN
                            for name in ("object", "oldObject", "params", "variables")})

Obj = dict[str, Any]


def _policy(file_name: str) -> Obj:
    doc: Obj = yaml.safe_load((CHART_FILES / file_name).read_text())
    return doc


def _eval(expression: str, data: Obj) -> Any:
    return ENV.compile(expression).eval(data=data).plain_value()


def admit(file_name: str, obj: Obj, crews: list[Obj]) -> str | None:
    """None when admitted, else the denial message (first failing validation)."""
    spec = _policy(file_name)["spec"]
    base = {"object": obj, "params": None, "variables": {}}
    if not all(_eval(m["expression"], base) is True for m in spec.get("matchConditions", [])):
        return None
    for crew in crews:  # parameterNotFoundAction: Allow when there is none
        variables: Obj = {}
        data = {"object": obj, "params": crew, "variables": variables}
        for var in spec.get("variables", []):
            variables[var["name"]] = _eval(var["expression"], data)
        for rule in spec["validations"]:
            if _eval(rule["expression"], data) is not True:
                return str(_eval(rule["messageExpression"], data))
    return None


def crew(name: str, uid: str, **storage: Any) -> Obj:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
            "metadata": {"name": name, "namespace": "team-a", "uid": uid},
            "spec": {"replicas": 2, "storage": {"accessMode": "ReadWriteOncePod", **storage}}}


def pod(name: str, *claims: str, **meta: Any) -> Obj:
    volumes = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
               for i, c in enumerate(claims)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", **meta},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes}}


RESEARCH = crew("research", "uid-research")
REF = CrewRef(name="research", namespace="team-a", uid="uid-research")
SPEC = parse_spec({"entrypoint": "m:a", "replicas": 2})
PODS = "policy-pods.yaml"
CREWS = "policy-crews.yaml"


def test_operator_replica_pods_are_admitted() -> None:
    for ordinal in (0, 1):
        real = replica_pod(REF, SPEC, ordinal, PodSettings())  # what the operator creates
        assert admit(PODS, real, [RESEARCH, crew("other", "uid-other")]) is None


def test_foreign_pod_on_a_state_claim_is_denied_naming_crew_and_claim() -> None:
    message = admit(PODS, pod("debugger", "research-state-0"), [RESEARCH])
    assert message is not None
    assert '"debugger"' in message and '"research-state-0"' in message
    assert 'Crew "research"' in message and "one writer per journal" in message


@pytest.mark.parametrize("forgery", [
    pytest.param({}, id="labels-without-owner"),
    pytest.param({"uid": "uid-someone-else"}, id="owner-with-other-uid"),
    pytest.param({"controller": False}, id="owner-not-controller"),
])
def test_copied_labels_or_owner_do_not_open_the_fence(forgery: Obj) -> None:
    real = replica_pod(REF, SPEC, 0, PodSettings())
    ref = {**owner_reference(REF), **forgery}
    real["metadata"]["ownerReferences"] = [ref] if forgery else []
    assert admit(PODS, real, [RESEARCH]) is not None


def test_replica_pod_may_not_mount_another_ordinals_claim() -> None:
    real = replica_pod(REF, SPEC, 0, PodSettings())
    real["spec"]["volumes"].append(
        {"name": "x", "persistentVolumeClaim": {"claimName": "research-state-1"}})
    message = admit(PODS, real, [RESEARCH])
    assert message is not None and '"research-state-1"' in message


def test_existing_claim_is_fenced_and_its_replica_admitted() -> None:
    owner = crew("owner", "uid-owner", existingClaim="team-data")
    assert admit(PODS, pod("thief", "team-data"), [owner]) is not None
    ref = CrewRef(name="owner", namespace="team-a", uid="uid-owner")
    spec = parse_spec({"entrypoint": "m:a", "replicas": 1,
                       "storage": {"existingClaim": "team-data"}})
    assert admit(PODS, replica_pod(ref, spec, 0, PodSettings()), [owner]) is None


@pytest.mark.parametrize("obj", [
    pytest.param({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                  "spec": {"containers": [{"name": "c", "image": "i"}]}}, id="no-volumes"),
    pytest.param(pod("p", "scratch"), id="own-claim"),
    pytest.param(pod("p", "researcher-state-0", "research-state-0x", "xresearch-state-0"),
                 id="look-alike-names"),
    pytest.param({**pod("p", "scratch"), "metadata": {"generateName": "p-"}},
                 id="generated-name"),
])
def test_unrelated_pods_are_admitted(obj: Obj) -> None:
    assert admit(PODS, obj, [RESEARCH]) is None


def test_namespace_without_crews_admits_everything() -> None:
    assert admit(PODS, pod("debugger", "research-state-0"), []) is None


def test_pod_without_claims_is_not_evaluated() -> None:
    spec = _policy(PODS)["spec"]
    plain = {"object": {"metadata": {"name": "p"}, "spec": {"containers": []}}}
    assert [_eval(m["expression"], plain) for m in spec["matchConditions"]] == [False]


@pytest.mark.parametrize("mode", ["ReadWriteMany", "ReadOnlyMany"])
def test_crew_with_shared_mode_is_denied(mode: str) -> None:
    message = admit(CREWS, crew("shared", "u", accessMode=mode), [RESEARCH])
    assert message is not None and mode in message and "ReadWriteOncePod" in message


def test_crew_reusing_another_crews_claim_is_denied() -> None:
    first = crew("first", "u1", existingClaim="team-data")
    message = admit(CREWS, crew("second", "u2", existingClaim="team-data"), [first])
    assert message is not None and '"team-data"' in message and 'Crew "first"' in message
    generated = admit(CREWS, crew("second", "u2", existingClaim="first-state-0"), [first])
    assert generated is not None and 'Crew "first"' in generated


def test_crew_may_keep_its_own_claim_and_use_a_free_one() -> None:
    first = crew("first", "u1", existingClaim="team-data")
    assert admit(CREWS, first, [first]) is None  # an UPDATE sees itself among the params
    assert admit(CREWS, crew("second", "u2", existingClaim="free"), [first]) is None
    assert admit(CREWS, crew("second", "u2", existingClaim="team-data"), []) is None


# --- one source, and the builders -----------------------------------------------------------

@pytest.mark.parametrize("file_name", admission.MANIFEST_FILES)
def test_operator_copy_is_byte_identical_to_the_chart(file_name: str) -> None:
    assert admission.manifest_text(file_name) == (CHART_FILES / file_name).read_text()


def test_no_other_admission_files_exist() -> None:
    assert sorted(p.name for p in CHART_FILES.iterdir()) == sorted(admission.MANIFEST_FILES)


@pytest.mark.parametrize("watch", [(), ("team-a", "team-b")])
def test_namespace_selector_always_excludes_kube_system_and_own_namespace(
    watch: tuple[str, ...]
) -> None:
    user = {"matchLabels": {"tier": "apps"},
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                  "values": ["kube-system", "team-a"]}]}
    selector = admission.namespace_selector(watch, ["crewfence-system"], user)
    assert selector["matchLabels"] == {"tier": "apps"}
    exprs = selector["matchExpressions"]
    assert user["matchExpressions"][0] in exprs
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["crewfence-system", "kube-system"]} in exprs
    scoped = [e for e in exprs if e["operator"] == "In" and e["values"] == sorted(watch)]
    assert bool(scoped) == bool(watch)


def test_glob_namespaces_are_not_turned_into_a_selector() -> None:
    selector = admission.namespace_selector(["team-*"])
    assert [e["operator"] for e in selector["matchExpressions"]] == ["NotIn"]


def test_webhook_configuration_only_sees_claim_mounting_pods() -> None:
    cfg = admission.webhook_configuration(admission.WebhookSettings(
        name="x", client_config=lambda hook: {"url": f"https://h:1/{hook}"},
        namespace_selector=admission.namespace_selector([])))
    hooks = {w["name"]: w for w in cfg["webhooks"]}
    assert set(hooks) == {"validate-pod.crewfence.dev", "validate-crew.crewfence.dev"}
    for hook in hooks.values():
        assert hook["failurePolicy"] == "Ignore" and hook["matchConditions"]
        assert hook["clientConfig"]["url"].endswith("/" + hook["name"].split(".")[0])
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system"]} in hook["namespaceSelector"]["matchExpressions"]
    pod_condition = hooks["validate-pod.crewfence.dev"]["matchConditions"][0]["expression"]
    assert _eval(pod_condition, {"object": pod("p")}) is False
    assert _eval(pod_condition, {"object": pod("p", "c")}) is True


def test_policy_objects_bind_every_policy_with_crews_as_params() -> None:
    objs = admission.policy_objects("rel", ["team-a"])
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert [p["metadata"]["name"] for p in policies] == ["rel-state-claims", "rel-crew-storage"]
    assert [b["spec"]["policyName"] for b in bindings] == ["rel-state-claims", "rel-crew-storage"]
    for b in bindings:
        assert b["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}
        assert b["spec"]["validationActions"] == ["Deny"]
    for p in policies:
        assert p["spec"]["paramKind"] == {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew"}


def test_the_crew_webhook_sees_a_crew_that_names_or_named_an_existing_claim() -> None:
    """An update that drops ``existingClaim`` (replica 0 back on ``<crew>-state-0``) reaches
    the webhook too, which warns about the claim left unserved; a Crew that never named one
    does not."""
    cfg = admission.webhook_configuration(admission.WebhookSettings(
        name="x", client_config=lambda hook: {"url": f"https://h:1/{hook}"},
        namespace_selector=admission.namespace_selector([])))
    hook = {w["name"]: w for w in cfg["webhooks"]}["validate-crew.crewfence.dev"]
    named = {"spec": {"storage": {"existingClaim": "team-state"}}}
    plain: Obj = {"spec": {"storage": {}}}

    def reaches(obj: Obj, old: Obj | None) -> bool:
        return all(_eval(m["expression"], {"object": obj, "oldObject": old}) is True
                   for m in hook["matchConditions"])

    assert reaches(named, None) and reaches(named, plain) and reaches(plain, named)
    assert not reaches(plain, None) and not reaches(plain, plain)
    assert not reaches({"spec": {"replicas": 1}}, {"spec": {"replicas": 2}})
