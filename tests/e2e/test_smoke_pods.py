"""The pod runner: Pods created with kubectl run real processes on their own pod IPs."""

from __future__ import annotations

import json
import signal
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

from harness import procs
from harness.handles import Cluster, PodRunner, wait_until


def http_pod(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "web",
                    "image": "python:3.11-slim",
                    "command": ["python", "-m", "http.server", "--bind", "$(POD_IP)", "8000"],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {
                        "httpGet": {"path": "/", "port": "http"},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }


def pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cluster.get_json("pod", name, "-n", namespace)
    return found


def is_ready(obj: dict[str, Any] | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_ready(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = wait_until(
        lambda: (p := pod(cluster, namespace, name)) is not None and is_ready(p) and p,
        timeout=90,
        what=f"pod {name} to be Ready",
    )
    return result


def http_get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return int(resp.status)


def test_pod_runs_a_real_process_reachable_on_its_pod_ip(
    cluster: Cluster, pod_runner: PodRunner, namespace: str
) -> None:
    cluster.apply(http_pod("web", namespace))
    obj = wait_ready(cluster, namespace, "web")
    ip = obj["status"]["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"
    assert obj["spec"]["nodeName"] == cluster.info.node_name
    assert obj["status"]["phase"] == "Running"
    assert http_get(f"http://{ip}:8000/") == 200
    pid = pod_runner.pid(namespace, "web")
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"http.server" in cmdline and ip.encode() in cmdline

    def logged() -> bool:  # `kubectl logs` goes API server -> the pod runner's log endpoint
        result = cluster.kubectl("logs", "web", "-n", namespace)
        assert result.returncode == 0, result.stderr
        return '"GET / HTTP/1.1" 200' in result.stdout

    wait_until(logged, timeout=60, what="the request in kubectl logs")


def test_sigkill_is_seen_as_a_restart(
    cluster: Cluster, pod_runner: PodRunner, namespace: str
) -> None:
    cluster.apply(http_pod("web", namespace))
    ip = wait_ready(cluster, namespace, "web")["status"]["podIP"]
    first = pod_runner.kill(namespace, "web", sig=signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        status = (pod(cluster, namespace, "web") or {}).get("status") or {}
        container = (status.get("containerStatuses") or [{}])[0]
        return container if container.get("restartCount") == 1 else None

    container = wait_until(restarted, timeout=60, what="restartCount to reach 1")
    terminated = container["lastState"]["terminated"]
    assert terminated["exitCode"] == 137
    assert terminated["signal"] == signal.SIGKILL
    obj = wait_ready(cluster, namespace, "web")
    assert obj["status"]["podIP"] == ip  # a restart keeps the pod (and its address)
    second = pod_runner.pid(namespace, "web")
    assert second is not None and second != first
    previous = cluster.kubectl("logs", "web", "-n", namespace, "--previous")
    assert previous.returncode == 0, previous.stderr
    assert '"GET / HTTP/1.1" 200' in previous.stdout  # the probe's requests before the kill
    assert previous.stdout == pod_runner.logs(namespace, "web", previous=True)
    assert http_get(f"http://{ip}:8000/") == 200


def test_force_delete_kills_the_process(
    cluster: Cluster, pod_runner: PodRunner, namespace: str
) -> None:
    cluster.apply(http_pod("web", namespace))
    wait_ready(cluster, namespace, "web")
    pid = pod_runner.pid(namespace, "web")
    assert pid is not None
    rec = procs.record_for("web", pid)
    result = cluster.kubectl("delete", "pod", "web", "-n", namespace, "--force", "--grace-period=0")
    assert result.returncode == 0, result.stderr
    wait_until(lambda: not procs.alive(rec), timeout=60, what="the process to die")
    assert pod(cluster, namespace, "web") is None


TERM_SCRIPT = textwrap.dedent(
    """
    import os, pathlib, signal, time
    marker = pathlib.Path("/data/term")
    def on_term(signum, frame):
        # written whole, then renamed: the test reads it the moment it exists
        marker.with_suffix(".tmp").write_text("SIGTERM")
        os.replace(marker.with_suffix(".tmp"), marker)  # and keep running: only SIGKILL ends us
    signal.signal(signal.SIGTERM, on_term)
    pathlib.Path("/data/started").write_text("yes")
    while True:
        time.sleep(0.1)
    """
)


def test_graceful_delete_sends_sigterm_then_sigkill(
    cluster: Cluster, pod_runner: PodRunner, namespace: str
) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stubborn", "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11-slim",
                    "command": ["python", "-c", TERM_SCRIPT],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
        },
    }
    cluster.apply(manifest)
    wait_ready(cluster, namespace, "stubborn")
    data = pod_runner.pod_dir(namespace, "stubborn") / "volumes" / "data"
    wait_until((data / "started").exists, timeout=60, what="the container to start")
    pid = pod_runner.pid(namespace, "stubborn")
    assert pid is not None
    rec = procs.record_for("main", pid)
    cluster.kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=false", check=True)
    wait_until((data / "term").exists, timeout=60, what="SIGTERM to arrive")
    assert (data / "term").read_text() == "SIGTERM"
    wait_until(lambda: not procs.alive(rec), timeout=60, what="SIGKILL after the grace period")
    wait_until(lambda: pod(cluster, namespace, "stubborn") is None, timeout=60, what="pod removal")


REPORT_SCRIPT = textwrap.dedent(
    """
    import json, os, pathlib
    def mode(p):
        st = os.stat(p)
        return {"mode": oct(st.st_mode & 0o7777), "gid": st.st_gid}
    report = {
        "env": {k: os.environ.get(k) for k in ("GREETING", "TOKEN", "CM_COLOUR", "POD_IP",
                                                "POD_NAME", "STATE", "HOME")},
        "greeting_file": pathlib.Path("/etc/cfg/greeting").read_text(),
        "token_file": mode("/etc/secret/token"),
        "state_dir": mode("/state"),
        "cwd": os.getcwd(),
    }
    pathlib.Path(os.environ["STATE"], "report.json").write_text(json.dumps(report))
    """
)


def test_pod_environment_volumes_and_claims(
    cluster: Cluster, pod_runner: PodRunner, namespace: str
) -> None:
    fs_group = 10001
    objects = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": namespace},
            "stringData": {"token": "s3cret"},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "namespace": namespace},
            "data": {"greeting": "hello", "COLOUR": "blue"},
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "state", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOncePod"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "report", "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"fsGroup": fs_group},
                "volumes": [
                    {"name": "state", "persistentVolumeClaim": {"claimName": "state"}},
                    {"name": "cfg", "configMap": {"name": "cfg"}},
                    {"name": "secret", "secret": {"secretName": "creds", "defaultMode": 0o600}},
                ],
                "containers": [
                    {
                        "name": "main",
                        "image": "python:3.11-slim",
                        "command": ["python", "-c", REPORT_SCRIPT],
                        "workingDir": "/state",
                        "env": [
                            {
                                "name": "GREETING",
                                "valueFrom": {
                                    "configMapKeyRef": {"name": "cfg", "key": "greeting"}
                                },
                            },
                            {
                                "name": "TOKEN",
                                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
                            },
                            {
                                "name": "POD_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                            },
                            {
                                "name": "POD_NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            },
                            {"name": "STATE", "value": "/state"},
                            {"name": "HOME", "value": "/state/home"},
                        ],
                        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CM_"}],
                        "volumeMounts": [
                            {"name": "state", "mountPath": "/state"},
                            {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True},
                            {"name": "secret", "mountPath": "/etc/secret", "readOnly": True},
                        ],
                    }
                ],
            },
        },
    ]
    for obj in objects:
        cluster.apply(obj)

    def finished() -> dict[str, Any] | None:
        obj = pod(cluster, namespace, "report")
        phase = ((obj or {}).get("status") or {}).get("phase")
        return obj if phase in ("Succeeded", "Failed") else None

    obj = wait_until(finished, timeout=90, what="the report pod to finish")
    assert obj["status"]["phase"] == "Succeeded", pod_runner.logs(namespace, "report")
    terminated = obj["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"

    claim = cluster.get_json("pvc", "state", "-n", namespace)
    assert claim["status"]["phase"] == "Bound"
    assert claim["status"]["accessModes"] == ["ReadWriteOncePod"]
    host = pod_runner.claim_dir(namespace, "state")
    report = json.loads((host / "report.json").read_text())
    assert report["env"] == {
        "GREETING": "hello",
        "TOKEN": "s3cret",
        "CM_COLOUR": "blue",
        "POD_IP": obj["status"]["podIP"],
        "POD_NAME": "report",
        "STATE": str(host),
        "HOME": str(host / "home"),
    }
    assert report["greeting_file"] == "hello"
    assert report["cwd"] == str(host)
    # What a kubelet does with fsGroup: the claim root is group-owned, setgid, 2770 here; a
    # secret file with defaultMode 0600 gains group read (0640) like on a real node.
    assert report["state_dir"] == {"mode": oct(0o2770), "gid": fs_group}
    assert report["token_file"] == {"mode": oct(0o640), "gid": fs_group}


def sleeper(name: str, namespace: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": claim}}],
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11-slim",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "volumeMounts": [{"name": "state", "mountPath": "/state"}],
                }
            ],
        },
    }


def test_read_write_once_pod_claim_admits_one_pod_at_a_time(
    cluster: Cluster, pod_runner: PodRunner, namespace: str
) -> None:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "only-one", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOncePod"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    cluster.apply(sleeper("first", namespace, "only-one"))
    wait_ready(cluster, namespace, "first")
    cluster.apply(sleeper("second", namespace, "only-one"))

    def unschedulable() -> bool:
        status = (pod(cluster, namespace, "second") or {}).get("status") or {}
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in status.get("conditions") or []
        )

    wait_until(unschedulable, timeout=60, what="the second pod to be unschedulable")
    second = pod(cluster, namespace, "second")
    assert second is not None and not second["spec"].get("nodeName")
    assert pod_runner.pid(namespace, "second") is None
    cluster.kubectl("delete", "pod", "first", "-n", namespace, check=True)
    wait_ready(cluster, namespace, "second")
    assert pod_runner.pid(namespace, "second") is not None
