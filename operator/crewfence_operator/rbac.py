"""The exact RBAC the operator needs: the chart renders its ClusterRole from these rules and
the e2e tests run the operator with nothing more (a real ServiceAccount token).

Each rule is a Kubernetes PolicyRule as a plain dict. Keep them minimal: add a verb here only
with the code that needs it, and say which code in the comment.
"""

from __future__ import annotations

from typing import Any, Final

from crewfence_operator import constants as c
from crewfence_operator.cronjob.children import PLURAL as CREWCRONJOB_PLURAL

PolicyRule = dict[str, Any]

OPERATOR_RULES: Final[list[PolicyRule]] = [
    # Our resources: kopf watches and patches them (annotations, finalizers); handlers read.
    {"apiGroups": [c.GROUP], "resources": [c.CREW_PLURAL, c.CREWJOB_PLURAL],
     "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": [c.GROUP], "resources": [f"{c.CREW_PLURAL}/status",
                                           f"{c.CREWJOB_PLURAL}/status"],
     "verbs": ["get", "patch", "update"]},
    # spec.ttlSecondsAfterFinished: handlers/ttl.py deletes finished CrewJobs.
    {"apiGroups": [c.GROUP], "resources": [c.CREWJOB_PLURAL], "verbs": ["delete"]},
    # Kueue (workloads.py, handlers/kueue.py): one Workload per labelled CrewJob, watched for
    # admission and eviction; its status is written to requeue or finish it.
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
     "verbs": ["get", "list", "watch", "create"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"],
     "verbs": ["get", "patch"]},
    # The value of a kueue.x-k8s.io/priority-class label (cluster-scoped).
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloadpriorityclasses"],
     "verbs": ["get"]},
    # Crew children (crew/children.py): replica pods and state claims; scale-down deletes.
    {"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims"],
     "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    # Headless Service per Crew.
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create"]},
    # Token Secret per Crew (created once; read back for /health and by the CrewJob handler);
    # with sidecar TLS also the Crew CA and each replica's TLS Secret, re-issued in place
    # (update) before expiry (transport/pki_apply.py).
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]},
    # Crews file per Crew; CrewJob full-output ConfigMaps (handlers/crewjob.py).
    {"apiGroups": [""], "resources": ["configmaps"],
     "verbs": ["get", "list", "create", "patch", "update", "delete"]},
    # Warning/Normal Events posted by kopf (kopf.warn / kopf.event) and handler logs.
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
    # kopf's cluster scan: which resources exist and which namespaces match.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    # CrewCronJob (handlers/crewcronjob.py): kopf watches and patches it, the daemon writes its
    # status, creates its child CrewJobs, cancels (patch, above) and trims them (delete).
    {"apiGroups": [c.GROUP], "resources": [CREWCRONJOB_PLURAL],
     "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": [c.GROUP], "resources": [f"{CREWCRONJOB_PLURAL}/status"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": [c.GROUP], "resources": [c.CREWJOB_PLURAL], "verbs": ["create", "delete"]},
    # kopf peering (--peering NAME) for more than one operator replica.
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings", "kopfpeerings"],
     "verbs": ["get", "list", "watch", "patch"]},
]

WEBHOOK_MANAGED_RULES: Final[list[PolicyRule]] = [
    # --webhook-mode managed only (out of cluster): admission_install.py server-side applies
    # the chart's policies, their bindings and a URL webhook configuration.
    {"apiGroups": ["admissionregistration.k8s.io"],
     "resources": ["validatingwebhookconfigurations", "validatingadmissionpolicies",
                   "validatingadmissionpolicybindings"],
     "verbs": ["get", "create", "patch"]},
]


CERT_MANAGER_RULES: Final[list[PolicyRule]] = [
    # CREWFENCE_OPERATOR_CERT_SOURCE=cert-manager only (chart: certManager.enabled):
    # transport/cert_manager_apply.py reads, creates and updates (replace) each Crew's Issuers and
    # Certificates; cert-manager itself writes the Secrets (read with the Secret rule above).
    {"apiGroups": ["cert-manager.io"], "resources": ["issuers", "certificates"],
     "verbs": ["get", "create", "update"]},
]


def rules(*, managed_webhook: bool = False, cert_manager: bool = False) -> list[PolicyRule]:
    """The ClusterRole rules; ``managed_webhook`` adds what the out-of-cluster mode needs,
    ``cert_manager`` what the cert-manager certificate source needs."""
    extra = [*(WEBHOOK_MANAGED_RULES if managed_webhook else []),
             *(CERT_MANAGER_RULES if cert_manager else [])]
    return [dict(rule) for rule in (*OPERATOR_RULES, *extra)]
