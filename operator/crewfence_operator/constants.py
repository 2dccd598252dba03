"""Names shared by every operator module: API identity, labels, kopf identity, ports."""

from __future__ import annotations

from typing import Final

GROUP: Final = "crewfence.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

CREW_KIND: Final = "Crew"
CREW_PLURAL: Final = "crews"
CREWJOB_KIND: Final = "CrewJob"
CREWJOB_PLURAL: Final = "crewjobs"

# --- labels on everything the operator creates -----------------------------------------------
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "crewfence"
LABEL_CREW: Final = "crewfence.dev/crew"
LABEL_REPLICA: Final = "crewfence.dev/replica"
LABEL_ROLE: Final = "crewfence.dev/role"
ROLE_STATE: Final = "state"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_NAME: Final = "app.kubernetes.io/name"

# --- kopf identity (chosen once; never change: it is stored on every object) ------------------
KOPF_PREFIX: Final = GROUP
FINALIZER: Final = f"{GROUP}/finalizer"
PEERING_DEFAULT_NAME: Final = "crewfence"
WEBHOOK_CONFIG_NAME: Final = "crewfence.dev"
# Handler ids = URL paths of the webhook server (``/<id>``); a Service-based configuration
# (the chart) points its webhooks at these paths.
WEBHOOK_CREW_ID: Final = "validate-crew"
WEBHOOK_POD_ID: Final = "validate-pod"

# --- the sidecar ------------------------------------------------------------------------------
SIDECAR_PORT: Final = 8090
SIDECAR_PORT_NAME: Final = "http"
SIDECAR_CONTAINER: Final = "sidecar"
SIDECAR_COMMAND: Final = "crewfence-sidecar"
TOKEN_SECRET_KEY: Final = "token"  # noqa: S105 - a key name, not a secret
CREWS_FILE_KEY: Final = "crews.yaml"

# Paths inside the sidecar container.
STATE_VOLUME: Final = "state"
"""The pod volume that mounts the replica's state claim (its journal)."""
STATE_MOUNT: Final = "/var/lib/crewfence"
# The journal sits one level below the mount: a volume root with fsGroup is group-writable,
# which the sidecar refuses as a journal parent.
STATE_FILE: Final = f"{STATE_MOUNT}/journal/journal.db"
# Training artifacts go to the claim's root: it exists and is writable (fsGroup) on first start,
# while a subPath folder would be created root-owned by the kubelet.
TRAINING_DIR: Final = STATE_MOUNT
CREWS_MOUNT: Final = "/etc/crewfence/crews"
CREWS_FILE: Final = f"{CREWS_MOUNT}/{CREWS_FILE_KEY}"
SCRATCH_MOUNT: Final = "/var/run/crewfence"
RUN_AS_USER: Final = 10001
FS_GROUP: Final = 10001

# --- conditions and reasons on a Crew ---------------------------------------------------------
COND_READY: Final = "Ready"
COND_STATE_SHARED: Final = "StateVolumeShared"
COND_CLAIMS_RETAINED: Final = "StateClaimsRetained"
COND_MODEL_CREDENTIALS: Final = "ModelCredentials"
COND_TOOLS_READY: Final = "ToolsReady"
COND_STALLED: Final = "Stalled"
COND_JOURNAL_FULL: Final = "JournalFull"

DEFAULT_IMAGE: Final = "ghcr.io/crewfence/crewfence:0.1.0"


def pod_name(crew: str, ordinal: int) -> str:
    return f"{crew}-{ordinal}"


def claim_name(crew: str, ordinal: int) -> str:
    return f"{crew}-state-{ordinal}"


def token_secret_name(crew: str) -> str:
    return f"{crew}-crewfence-token"


def crews_configmap_name(crew: str) -> str:
    return f"{crew}-crewfence-crews"


def service_name(crew: str) -> str:
    return crew
