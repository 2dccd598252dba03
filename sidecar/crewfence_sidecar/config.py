"""Sidecar configuration: CREWFENCE_* environment variables, each also a command-line flag.

Everything here is checked before the port is bound; a problem is a ``ConfigError`` whose
message is the one line the CLI prints on stderr. Never put the token into a message.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NoReturn

from crewfence_sidecar.contract import Operation
from crewfence_sidecar.credentials import CredentialError
from crewfence_sidecar.credentials import read_token_file as read_token_lines


class ConfigError(Exception):
    """Bad configuration; the message is safe to print (never contains a secret)."""


@dataclass(frozen=True)
class Bound:
    env: str
    flag: str
    default: int
    minimum: int
    maximum: int
    help: str


BOUNDS: Final[dict[str, Bound]] = {
    "max_concurrency": Bound("CREWFENCE_MAX_CONCURRENCY", "--max-concurrency", 4, 1, 1024,
                             "jobs executing at once"),
    "max_retained_runs": Bound("CREWFENCE_MAX_RETAINED_RUNS", "--max-retained-runs", 10_000, 1,
                               1_000_000, "records kept in the journal (507 when full)"),
    "max_events_per_run": Bound("CREWFENCE_MAX_EVENTS_PER_RUN", "--max-events-per-run", 10_000,
                                4, 1_000_000, "events kept per record"),
    "max_event_bytes": Bound("CREWFENCE_MAX_EVENT_BYTES", "--max-event-bytes", 256 * 1024, 1024,
                             64 * 1024 * 1024, "encoded size of one event"),
    "max_state_bytes": Bound("CREWFENCE_MAX_STATE_BYTES", "--max-state-bytes", 1024**3,
                             1024 * 1024, 1024**4, "size of the journal file"),
    "tombstone_retention_seconds": Bound(
        "CREWFENCE_TOMBSTONE_RETENTION_SECONDS", "--tombstone-retention-seconds", 0, 0,
        100 * 366 * 24 * 3600, "how long an archived action's tombstone keeps refusing to run "
        "it again (410/409), from its first archive; 0 = never expires"),
    # Each job runs in its own worker process (crewfence_sidecar.workers).
    "worker_stop_grace_ms": Bound("CREWFENCE_WORKER_STOP_GRACE_MS", "--worker-stop-grace-ms",
                                  2000, 0, 60_000, "on cancel/timeout, SIGTERM to the job's "
                                  "process group, this grace, then SIGKILL"),
    "worker_memory_mb": Bound("CREWFENCE_WORKER_MEMORY_MB", "--worker-memory-mb", 0, 0,
                              1024 * 1024, "address-space limit (RLIMIT_AS) of each job's "
                              "worker in MiB; 0 = none"),
    "worker_spares": Bound("CREWFENCE_WORKER_SPARES", "--worker-spares", 2, 0, 64,
                           "idle workers forked ahead and warmed up, while fewer than "
                           "max-concurrency workers are alive; 0 = fork at admission"),
    "worker_cpu_seconds": Bound("CREWFENCE_WORKER_CPU_SECONDS", "--worker-cpu-seconds", 0, 0,
                                7 * 24 * 3600, "CPU-time limit (RLIMIT_CPU) of each job's "
                                "worker; 0 = none"),
    "worker_max_jobs": Bound("CREWFENCE_WORKER_MAX_JOBS", "--worker-max-jobs", 100, 1,
                             1_000_000, "jobs one worker may run in turn (reused only when "
                             "its job ended on its own and left nothing running; never with "
                             "a CPU limit); 1 = a fresh worker per job"),
    "worker_nice": Bound("CREWFENCE_WORKER_NICE", "--worker-nice", 5, 0, 19,
                         "nice levels each job's worker runs below the sidecar, so that "
                         "admissions, tool-call acknowledgements and answers do not wait for "
                         "a CPU behind the crews; 0 = the sidecar's priority"),
    "worker_max_rss_mb": Bound("CREWFENCE_WORKER_MAX_RSS_MB", "--worker-max-rss-mb", 1024, 1,
                               1024 * 1024, "a worker whose resident set reached this many "
                               "MiB after a job exits instead of taking another"),
}

DEFAULT_HOST: Final = "0.0.0.0"  # noqa: S104 - a pod's sidecar must be reachable
DEFAULT_PORT: Final = 8090


@dataclass(frozen=True)
class SidecarConfig:
    registry: str | None = None
    crews_file: Path | None = None
    state_file: Path | None = None
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    """When set, the accepted tokens are this file's lines, re-read when it changes."""
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    allowed_operations: frozenset[Operation] = frozenset({Operation.RUN})
    max_concurrency: int = BOUNDS["max_concurrency"].default
    max_retained_runs: int = BOUNDS["max_retained_runs"].default
    max_events_per_run: int = BOUNDS["max_events_per_run"].default
    max_event_bytes: int = BOUNDS["max_event_bytes"].default
    max_state_bytes: int = BOUNDS["max_state_bytes"].default
    tombstone_retention_seconds: int = BOUNDS["tombstone_retention_seconds"].default
    worker_stop_grace_ms: int = BOUNDS["worker_stop_grace_ms"].default
    worker_memory_mb: int = BOUNDS["worker_memory_mb"].default
    worker_cpu_seconds: int = BOUNDS["worker_cpu_seconds"].default
    worker_spares: int = BOUNDS["worker_spares"].default
    worker_max_jobs: int = BOUNDS["worker_max_jobs"].default
    worker_max_rss_mb: int = BOUNDS["worker_max_rss_mb"].default
    worker_nice: int = BOUNDS["worker_nice"].default
    training_dir: Path | None = None
    ephemeral: bool = False
    resume_material: bool = False
    """Journal full task outputs and tool results (bounded) so a successor can resume."""
    allow_unauthenticated: bool = False
    log_level: str = "INFO"
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    insecure_plaintext: bool = False
    pod_uid: str | None = None
    """The pod's uid (``CREWFENCE_POD_UID``, the downward API's ``metadata.uid``): named in
    /health so a client can tell which pod answered at an address."""

    @property
    def authenticated(self) -> bool:
        return self.token is not None

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Parser(argparse.ArgumentParser):
    """Flag errors become ConfigError: one line, not a usage block."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="crewfence-sidecar",
        description="Durable, idempotent, fenced CrewAI execution server. Every flag also "
                    "reads its CREWFENCE_* environment variable; a flag wins.")
    p.add_argument("--registry", help="module:attribute mapping crew_id -> factory "
                   "(CREWFENCE_REGISTRY)")
    p.add_argument("--crews-file", help="YAML file of declarative crews (CREWFENCE_CREWS_FILE)")
    p.add_argument("--state-file", help="the journal (CREWFENCE_STATE_FILE)")
    p.add_argument("--token", help="bearer token (CREWFENCE_TOKEN); prefer --token-file")
    p.add_argument("--token-file", help="file holding the bearer token, regular, mode 0600 "
                   "(CREWFENCE_TOKEN_FILE)")
    p.add_argument("--host", help=f"bind address, default {DEFAULT_HOST} (CREWFENCE_HOST)")
    p.add_argument("--port", help=f"bind port, default {DEFAULT_PORT} (CREWFENCE_PORT)")
    p.add_argument("--allowed-operations", help="comma list, default run "
                   "(CREWFENCE_ALLOWED_OPERATIONS)")
    for b in BOUNDS.values():
        p.add_argument(b.flag, help=f"{b.help}; {b.minimum}..{b.maximum}, default {b.default} "
                       f"({b.env})")
    p.add_argument("--training-dir", help="where train may write; required when train is "
                   "enabled (CREWFENCE_TRAINING_DIR)")
    p.add_argument("--ephemeral", action="store_const", const="1", default=None,
                   help="no state file; loopback only (CREWFENCE_EPHEMERAL=1)")
    p.add_argument("--resume-material", action="store_const", const="1", default=None,
                   help="journal full task outputs and tool results (at most 64 KiB each) so a "
                   "successor can resume the job (CREWFENCE_RESUME_MATERIAL=1)")
    p.add_argument("--allow-unauthenticated", action="store_const", const="1", default=None,
                   help="no token; loopback only (CREWFENCE_ALLOW_UNAUTHENTICATED=1)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (CREWFENCE_LOG_LEVEL)")
    p.add_argument("--tls-cert-file", help="serving certificate chain, PEM, re-read when it "
                   "changes (CREWFENCE_TLS_CERT_FILE)")
    p.add_argument("--tls-key-file", help="its private key, PEM, mode 0600 "
                   "(CREWFENCE_TLS_KEY_FILE)")
    p.add_argument("--tls-client-ca-file", help="CA that signs client certificates, PEM "
                   "(CREWFENCE_TLS_CLIENT_CA_FILE)")
    p.add_argument("--insecure-plaintext", action="store_const", const="1", default=None,
                   help="serve plain HTTP off loopback: no encryption, no client "
                   "certificates; development only (CREWFENCE_INSECURE_PLAINTEXT=1)")
    return p


def _pick(flag_value: str | None, env: Mapping[str, str], name: str) -> str | None:
    if flag_value is not None:
        return flag_value
    value = env.get(name)
    return value if value not in (None, "") else None


def _flag_bool(raw: str | None, name: str) -> bool:
    if raw is None:
        return False
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be 1/true or 0/false")


def _int_in(raw: str, name: str, lo: int, hi: int) -> int:
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ConfigError(f"{name} must be an integer {lo}..{hi}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{name} must be in {lo}..{hi}, got {value}")
    return value


def read_token_file(path: Path) -> str:
    """The file's first token. The file must be a regular file (a Secret volume's symlink to
    one is fine), owner-only (0600 or 0400); it may hold several tokens, one per line (all are
    accepted: a token roll's overlap)."""
    try:
        return read_token_lines(path)[0]
    except CredentialError as exc:
        raise ConfigError(str(exc)) from None


def _operations(raw: str | None) -> frozenset[Operation]:
    if raw is None:
        return frozenset({Operation.RUN})
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        raise ConfigError("CREWFENCE_ALLOWED_OPERATIONS is empty")
    valid = {o.value for o in Operation}
    bad = [n for n in names if n not in valid]
    if bad:
        raise ConfigError(f"CREWFENCE_ALLOWED_OPERATIONS: unknown operation {bad[0]!r} "
                          f"(known: {', '.join(sorted(valid))})")
    return frozenset(Operation(n) for n in names)


def load_config(argv: Sequence[str] | None = None,
                env: Mapping[str, str] | None = None) -> SidecarConfig:
    """Parse flags and environment into a validated config, or raise ConfigError."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)

    registry = _pick(args.registry, env, "CREWFENCE_REGISTRY")
    if registry is not None and (registry.count(":") != 1 or not all(registry.split(":"))):
        raise ConfigError("CREWFENCE_REGISTRY must look like module:attribute")
    crews_raw = _pick(args.crews_file, env, "CREWFENCE_CREWS_FILE")
    crews_file = Path(crews_raw) if crews_raw else None
    if crews_file is not None and not crews_file.is_file():
        raise ConfigError(f"CREWFENCE_CREWS_FILE {crews_file} is not a readable file")
    if registry is None and crews_file is None:
        raise ConfigError("no crews: set CREWFENCE_REGISTRY and/or CREWFENCE_CREWS_FILE")

    host = _pick(args.host, env, "CREWFENCE_HOST") or DEFAULT_HOST
    port_raw = _pick(args.port, env, "CREWFENCE_PORT")
    port = DEFAULT_PORT if port_raw is None else _int_in(port_raw, "CREWFENCE_PORT", 0, 65535)
    loopback = is_loopback(host)

    ephemeral = _flag_bool(_pick(args.ephemeral, env, "CREWFENCE_EPHEMERAL"),
                           "CREWFENCE_EPHEMERAL")
    resume_material = _flag_bool(_pick(args.resume_material, env, "CREWFENCE_RESUME_MATERIAL"),
                                 "CREWFENCE_RESUME_MATERIAL")
    unauth = _flag_bool(_pick(args.allow_unauthenticated, env,
                              "CREWFENCE_ALLOW_UNAUTHENTICATED"),
                        "CREWFENCE_ALLOW_UNAUTHENTICATED")
    if ephemeral and not loopback:
        raise ConfigError(f"CREWFENCE_EPHEMERAL is refused off loopback (host {host})")
    if unauth and not loopback:
        raise ConfigError(f"CREWFENCE_ALLOW_UNAUTHENTICATED is refused off loopback (host {host})")

    state_raw = _pick(args.state_file, env, "CREWFENCE_STATE_FILE")
    if ephemeral and state_raw:
        raise ConfigError("CREWFENCE_EPHEMERAL and CREWFENCE_STATE_FILE are exclusive")
    if not ephemeral and not state_raw:
        raise ConfigError("CREWFENCE_STATE_FILE is required (CREWFENCE_EPHEMERAL=1 only on "
                          "loopback for development)")

    token_inline = _pick(args.token, env, "CREWFENCE_TOKEN")
    token_file = _pick(args.token_file, env, "CREWFENCE_TOKEN_FILE")
    if token_inline is not None and token_file is not None:
        raise ConfigError("CREWFENCE_TOKEN and CREWFENCE_TOKEN_FILE are exclusive")
    token: str | None
    if token_file is not None:
        token = read_token_file(Path(token_file))
    elif token_inline is not None:
        token = token_inline.strip()
        if not token:
            raise ConfigError("CREWFENCE_TOKEN is blank")
    else:
        token = None
    if token is not None and any(ord(ch) < 0x21 or ord(ch) > 0x7E for ch in token):
        raise ConfigError("the bearer token must be printable ASCII without spaces")
    if token is None and not unauth:
        raise ConfigError("no bearer token: set CREWFENCE_TOKEN_FILE (or CREWFENCE_TOKEN); "
                          "CREWFENCE_ALLOW_UNAUTHENTICATED=1 only on loopback")
    if token is not None and unauth:
        raise ConfigError("CREWFENCE_ALLOW_UNAUTHENTICATED and a token are exclusive")

    operations = _operations(_pick(args.allowed_operations, env, "CREWFENCE_ALLOWED_OPERATIONS"))

    bounds: dict[str, int] = {}
    for key, b in BOUNDS.items():
        raw = _pick(getattr(args, key), env, b.env)
        bounds[key] = b.default if raw is None else _int_in(raw, b.env, b.minimum, b.maximum)

    training_raw = _pick(args.training_dir, env, "CREWFENCE_TRAINING_DIR")
    training_dir = Path(training_raw).absolute() if training_raw else None
    if Operation.TRAIN in operations and training_dir is None:
        raise ConfigError("CREWFENCE_TRAINING_DIR is required when train is enabled")
    if training_dir is not None:
        if training_dir.is_symlink() or not training_dir.is_dir():
            raise ConfigError(f"CREWFENCE_TRAINING_DIR {training_dir} is not a directory "
                              "(symlinks refused)")
        if not os.access(training_dir, os.W_OK | os.X_OK):
            raise ConfigError(f"CREWFENCE_TRAINING_DIR {training_dir} is not writable")

    log_level = (_pick(args.log_level, env, "CREWFENCE_LOG_LEVEL") or "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError("CREWFENCE_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR")

    pod_uid = env.get("CREWFENCE_POD_UID") or None
    if pod_uid is not None and (len(pod_uid) > 128 or not pod_uid.isprintable()):
        raise ConfigError("CREWFENCE_POD_UID must be at most 128 printable characters")

    tls_files = _tls_files(args, env)
    plaintext = _flag_bool(_pick(args.insecure_plaintext, env, "CREWFENCE_INSECURE_PLAINTEXT"),
                           "CREWFENCE_INSECURE_PLAINTEXT")
    if tls_files is not None and plaintext:
        raise ConfigError("CREWFENCE_INSECURE_PLAINTEXT and CREWFENCE_TLS_* are exclusive")
    if tls_files is None and not loopback and not plaintext:
        raise ConfigError(f"refusing plain HTTP on {host}: set CREWFENCE_TLS_CERT_FILE, "
                          "CREWFENCE_TLS_KEY_FILE and CREWFENCE_TLS_CLIENT_CA_FILE, or "
                          "CREWFENCE_INSECURE_PLAINTEXT=1 (development only)")

    return SidecarConfig(
        registry=registry, crews_file=crews_file,
        state_file=Path(state_raw).absolute() if state_raw else None,
        token=token, host=host, port=port, allowed_operations=operations,
        training_dir=training_dir, ephemeral=ephemeral, allow_unauthenticated=unauth,
        resume_material=resume_material,
        log_level=log_level,
        token_file=Path(token_file).absolute() if token_file is not None else None,
        tls_cert_file=tls_files[0] if tls_files else None,
        tls_key_file=tls_files[1] if tls_files else None,
        tls_client_ca_file=tls_files[2] if tls_files else None,
        insecure_plaintext=plaintext, pod_uid=pod_uid, **bounds,
    )


TLS_SETTINGS: Final = (("tls_cert_file", "CREWFENCE_TLS_CERT_FILE"),
                       ("tls_key_file", "CREWFENCE_TLS_KEY_FILE"),
                       ("tls_client_ca_file", "CREWFENCE_TLS_CLIENT_CA_FILE"))


def _tls_files(args: argparse.Namespace,
               env: Mapping[str, str]) -> tuple[Path, Path, Path] | None:
    """All three TLS files, or none; each checked now (the key owner-only)."""
    from crewfence_sidecar.tls import TlsFiles

    raw = [_pick(getattr(args, attr), env, name) for attr, name in TLS_SETTINGS]
    if not any(raw):
        return None
    missing = [name for (_, name), value in zip(TLS_SETTINGS, raw, strict=True) if not value]
    if missing:
        raise ConfigError(f"TLS needs all of CREWFENCE_TLS_CERT_FILE, CREWFENCE_TLS_KEY_FILE, "
                          f"CREWFENCE_TLS_CLIENT_CA_FILE; missing {', '.join(missing)}")
    cert, key, ca = (Path(v).absolute() for v in raw if v)
    try:
        TlsFiles(cert=cert, key=key, client_ca=ca).check()
    except CredentialError as exc:
        raise ConfigError(str(exc)) from None
    return cert, key, ca
