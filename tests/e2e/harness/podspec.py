"""What the pod runner derives from a Pod spec: environment, volumes on disk, argv, cwd.

There is no image filesystem and no mount namespace: a volume is a host folder, and every
env value, argument and working directory that names a mount path is rewritten to that
folder. Files are written with the modes a kubelet would give them, including the
`fsGroup` ownership rules (group set to fsGroup; files OR 0440 (read-only volumes) or 0660;
folders also setgid and g+x).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .kubeapi import Api, Obj

RO_MASK, RW_MASK, EXEC_MASK = 0o440, 0o660, 0o110
# Volume types whose content the kubelet projects read-only.
PROJECTED_TYPES = ("configMap", "secret", "downwardAPI", "projected")


class ConfigError(Exception):
    """The container cannot start yet (missing Secret/ConfigMap key, unbound claim)."""


@dataclass(frozen=True)
class Mount:
    mount_path: str
    host_path: Path
    read_only: bool


@dataclass(frozen=True)
class PodContext:
    pod: Obj
    pod_ip: str
    host_ip: str
    ca_pem: bytes  # written where a kube-root-ca.crt ConfigMap is projected but missing


def field_ref(ctx: PodContext, path: str) -> str:
    meta, spec = ctx.pod["metadata"], ctx.pod["spec"]
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": ctx.pod_ip,
        "status.podIPs": ctx.pod_ip,
        "status.hostIP": ctx.host_ip,
        "status.hostIPs": ctx.host_ip,
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match[1]) or {}).get(match[2], ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "\n".join(f'{k}="{v}"' for k, v in items)
    raise ConfigError(f"unsupported fieldRef {path}")


def resource_ref(container: Obj, ref: Obj) -> str:
    kind, _, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:  # no limit: the node's capacity, as the kubelet reports it
        value = str(os.cpu_count() or 1) if name == "cpu" else "0"
    return str(value)


async def _key(api: Api, ns: str, kind: str, ref: Obj, key: str) -> str | None:
    plural = "secrets" if kind == "secret" else "configmaps"
    obj = await api.get(f"/api/v1/namespaces/{ns}/{plural}/{ref['name']}")
    optional = bool(ref.get("optional"))
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind} "{ref["name"]}" not found')
    value = _data(obj, kind).get(key)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {key} in {kind} {ns}/{ref['name']}")
    return value.decode(errors="replace")


def _data(obj: Obj, kind: str) -> dict[str, bytes]:
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return out


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names expand, `$$` escapes, unknown stay."""

    def repl(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        return env.get(m[1], m[0])

    return _VAR.sub(repl, value)


async def container_env(api: Api, ctx: PodContext, container: Obj) -> dict[str, str]:
    ns = ctx.pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, ref in (
            ("configMap", source.get("configMapRef")),
            ("secret", source.get("secretRef")),
        ):
            if not ref:
                continue
            plural = "secrets" if kind == "secret" else "configmaps"
            obj = await api.get(f"/api/v1/namespaces/{ns}/{plural}/{ref['name']}")
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind} "{ref["name"]}" not found')
            env.update(
                {prefix + k: v.decode(errors="replace") for k, v in _data(obj, kind).items()}
            )
    for var in container.get("env") or []:
        value: str | None
        if "valueFrom" not in var:
            value = expand(var.get("value", ""), env)
        else:
            src = var["valueFrom"]
            if "fieldRef" in src:
                value = field_ref(ctx, src["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in src:
                value = resource_ref(container, src["resourceFieldRef"])
            elif "secretKeyRef" in src:
                value = await _key(
                    api, ns, "secret", src["secretKeyRef"], src["secretKeyRef"]["key"]
                )
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                value = await _key(api, ns, "configMap", ref, ref["key"])
            else:
                raise ConfigError(f"unsupported valueFrom in env {var['name']}")
        if value is not None:
            env[var["name"]] = value
    return env


def rewrite(value: str, mounts: list[Mount]) -> str:
    """Replace mount paths (at a path boundary) with their host folders, in one pass."""
    if not mounts:
        return value
    by_path = {m.mount_path.rstrip("/") or "/": str(m.host_path) for m in mounts}
    alternatives = "|".join(re.escape(p) for p in sorted(by_path, key=len, reverse=True))
    pattern = r"(?<![\w./-])(" + alternatives + r")(?=/|$|[\s:,;=\"'])"
    return re.sub(pattern, lambda m: by_path[m[1]], value)


# --- volumes ---------------------------------------------------------------------------------


def apply_fs_group(
    root: Path, fs_group: int | None, read_only: bool, change_policy: str | None = None
) -> None:
    """What the kubelet's SetVolumeOwnership does for a volume when the pod has an fsGroup.

    With `fsGroupChangePolicy: OnRootMismatch` the kubelet leaves the tree alone when the
    volume root already has the group and permission bits (its skipPermissionChange).
    """
    if fs_group is None:
        return
    mask = RO_MASK if read_only else RW_MASK
    if change_policy == "OnRootMismatch":
        root_stat = root.lstat()
        wanted = mask | 0o2000 | EXEC_MASK
        if root_stat.st_gid == fs_group and (root_stat.st_mode & wanted) == wanted:
            return
    paths = [root]
    for dirpath, dirnames, filenames in os.walk(root):
        paths.extend(Path(dirpath) / name for name in (*dirnames, *filenames))
    for path in paths:
        if path.is_symlink():
            continue
        try:
            os.lchown(path, -1, fs_group)
        except PermissionError:
            pass
        extra = mask | ((0o2000 | EXEC_MASK) if path.is_dir() else 0)
        path.chmod((path.lstat().st_mode & 0o7777) | extra)


def _write_file(base: Path, rel: str, data: bytes, mode: int) -> None:
    target = base / rel
    if ".." in Path(rel).parts or Path(rel).is_absolute():
        raise ConfigError(f"invalid projected path {rel}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod(mode)


async def _project(
    api: Api, ctx: PodContext, source_kind: str, source: Obj, base: Path, default_mode: int
) -> None:
    ns = ctx.pod["metadata"]["namespace"]
    if source_kind in ("configMap", "secret"):
        name = source.get("name") or source.get("secretName")
        plural = "secrets" if source_kind == "secret" else "configmaps"
        obj = await api.get(f"/api/v1/namespaces/{ns}/{plural}/{name}")
        if obj is None:
            if source_kind == "configMap" and name == "kube-root-ca.crt":
                obj = {"data": {"ca.crt": ctx.ca_pem.decode()}}
            elif source.get("optional"):
                return
            else:
                raise ConfigError(f'{source_kind} "{name}" not found')
        data = _data(obj, source_kind)
        items = source.get("items") or [{"key": k, "path": k} for k in sorted(data)]
        for item in items:
            if item["key"] not in data:
                if source.get("optional"):
                    continue
                raise ConfigError(f"key {item['key']} not in {source_kind} {ns}/{name}")
            _write_file(base, item["path"], data[item["key"]], item.get("mode", default_mode))
    elif source_kind == "downwardAPI":
        for item in source.get("items") or []:
            if "fieldRef" in item:
                value = field_ref(ctx, item["fieldRef"]["fieldPath"])
            else:
                container = _container(ctx.pod, item["resourceFieldRef"].get("containerName"))
                value = resource_ref(container, item["resourceFieldRef"])
            _write_file(base, item["path"], value.encode(), item.get("mode", default_mode))
    elif source_kind == "serviceAccountToken":
        meta = ctx.pod["metadata"]
        sa = ctx.pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": source.get("expirationSeconds", 3600),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        answer = await api.create(
            f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        if answer is None:
            raise ConfigError(f'serviceaccount "{sa}" not found')
        _write_file(base, source["path"], answer["status"]["token"].encode(), 0o600)


def _container(pod: Obj, name: str | None) -> Obj:
    containers = pod["spec"]["containers"]
    return next((c for c in containers if c["name"] == name), containers[0])


async def materialise_volume(api: Api, ctx: PodContext, volume: Obj, target: Path) -> None:
    """Write a configMap/secret/downwardAPI/projected/emptyDir volume into `target`."""
    fs_group = (ctx.pod["spec"].get("securityContext") or {}).get("fsGroup")
    if "emptyDir" in volume:
        target.mkdir(parents=True, exist_ok=True)
        target.chmod(0o777)
        apply_fs_group(target, fs_group, read_only=False)
        return
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    kind = next(k for k in PROJECTED_TYPES if k in volume)
    source = volume[kind]
    default_mode = source.get("defaultMode", 0o644)
    if kind == "projected":
        for entry in source.get("sources") or []:
            sub_kind, sub = next(iter(entry.items()))
            await _project(api, ctx, sub_kind, sub, target, default_mode)
    else:
        await _project(api, ctx, kind, source, target, default_mode)
    apply_fs_group(target, fs_group, read_only=True)


def _files(root: Path) -> dict[Path, Path]:
    return {p.relative_to(root): p for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


async def refresh_volume(api: Api, ctx: PodContext, volume: Obj, target: Path) -> bool:
    """The kubelet's periodic sync of a configMap/secret/downwardAPI/projected volume: the
    current content, written next to `target` with the same modes and fsGroup pass, moves in
    file by file (each `os.replace` atomic; the kubelet swaps the whole volume at once, so a
    reader may briefly see a new certificate beside an old key here, never a torn file).
    A source that is missing now keeps the old content. True when anything changed."""
    if not any(k in volume for k in PROJECTED_TYPES):
        return False
    staging = target.with_name(target.name + ".next")
    try:
        await materialise_volume(api, ctx, volume, staging)
        new, old = _files(staging), _files(target)
        changed = False
        for rel, src in sorted(new.items()):
            dst = target / rel
            if rel in old and dst.read_bytes() == src.read_bytes() \
                    and dst.stat().st_mode == src.stat().st_mode:
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            changed = True
        for rel in old.keys() - new.keys():
            (target / rel).unlink()
            changed = True
        return changed
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def resolve_command(argv: list[str], env_path: str, mounts: list[Mount]) -> list[str]:
    """argv with argv[0] found on the pod's PATH (the venv first); an image path such as
    /usr/local/bin/crewfence-sidecar that does not exist here falls back to its basename."""
    if not argv:
        raise ConfigError("container has no command: the pod runner has no images")
    exe = rewrite(argv[0], mounts)
    if os.sep in exe and not Path(exe).exists():
        exe = Path(exe).name
    if os.sep not in exe:
        found = shutil.which(exe, path=env_path)
        if found is None:
            raise ConfigError(f'executable "{exe}" not found in $PATH')
        exe = found
    return [exe, *(rewrite(a, mounts) for a in argv[1:])]
