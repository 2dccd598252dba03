#!/usr/bin/env python3
"""The crewfence demo: a real control plane, the operator, a CrewJob that succeeds, and a slow
CrewJob whose pod is killed, ending with an honestly uncertain outcome and recovery advice;
then a person resolves it with the kubectl plugin and resumes it: its linked successor runs
once, reusing from the journal what had finished (the first task, the model call that asked
for the tool) and running again only the tool call in doubt, with the same idempotency key.

    python tests/e2e/demo.py [--keep]      # --keep leaves the cluster running afterwards

It prints what it does in plain words and exits non-zero when a step fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from crewjob_support import (
    EXAMPLES,
    condition,
    events_for,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness import build, controlplane
from harness.handles import Cluster
from plugin_support import kubectl_plugin, plugin_dir

NAMESPACE = "crewfence-demo"
STATE_DIR = controlplane.REPO / ".e2e" / "demo"


class StepFailed(Exception):
    pass


def say(text: str) -> None:
    print(textwrap.fill(text, width=96), flush=True)


def step(title: str, action: Callable[[], Any]) -> Any:
    print(f"\n==> {title}", flush=True)
    started = time.monotonic()
    try:
        result = action()
    except Exception as exc:  # every failure ends the demo with its reason
        raise StepFailed(f"{title}: {exc}") from exc
    print(f"    done in {time.monotonic() - started:.1f}s", flush=True)
    return result


def show(cluster: Cluster, *args: str) -> str:
    result = cluster.kubectl(*args)
    text = (result.stdout or result.stderr).rstrip()
    print(textwrap.indent(f"$ kubectl {' '.join(args)}\n{text}", "    "), flush=True)
    if result.returncode != 0:
        raise StepFailed(f"kubectl {' '.join(args)} failed")
    return text


def run_demo(keep: bool) -> int:
    say("crewfence runs CrewAI crews on Kubernetes as declarative, idempotent, fenced "
        "Actions. This demo starts a local control plane (etcd + kube-apiserver built from "
        "source, a small pod runner instead of a kubelet) and the crewfence operator.")
    kube_bin = step("Building or finding the control-plane binaries",
                    lambda: build.ensure_binaries())
    info = step("Starting etcd, kube-apiserver, the pod runner and the operator "
                "(CRDs installed from crds/)",
                lambda: controlplane.up(STATE_DIR, kube_bin, with_operator=True))
    cluster = Cluster(info)
    try:
        print(f"    {info.env_lines.replace(chr(10), chr(10) + '    ')}")
        step("Creating namespace crewfence-demo", lambda: (
            show(cluster, "apply", "-f", str(EXAMPLES / "namespace.yaml")),
            controlplane.ensure_default_service_account(info, NAMESPACE)))
        say("A Crew is a deployed crew: two sidecar pods, each with its own journal on its "
            "own volume. This one uses the built-in offline model: no API key, no network.")
        step("Applying examples/crew-research.yaml and waiting for 2 ready replicas", lambda: (
            show(cluster, "apply", "-n", NAMESPACE, "-f", str(EXAMPLES / "crew-research.yaml")),
            wait_crew_ready(cluster, NAMESPACE, "research", 2, timeout=300)))
        show(cluster, "get", "crews,pods,pvc", "-n", NAMESPACE)
        say("The operator talks to the sidecars over mutual TLS (the default): it keeps a CA "
            "per Crew and a serving certificate per replica in Secrets the Crew owns, renews "
            "them before they expire, and presents a client certificate of that CA on every "
            "call. The token, keys and model API key reach the pods as files, never as "
            "environment variables.")
        show(cluster, "get", "secrets", "-n", NAMESPACE)

        say("A CrewJob is one Action. Its action id defaults to <namespace>/<name>, so "
            "applying the same manifest again is an exact repeat, never a second run.")
        step("Applying examples/crewjob-run.yaml and waiting for it to succeed", lambda: (
            show(cluster, "apply", "-n", NAMESPACE, "-f", str(EXAMPLES / "crewjob-run.yaml")),
            _expect(wait_phase(cluster, NAMESPACE, "crewjob-run", timeout=300),
                    "Succeeded", uncertain=False)))
        show(cluster, "get", "crewjobs", "-n", NAMESPACE)
        show(cluster, "get", "crewjob", "crewjob-run", "-n", NAMESPACE,
             "-o", "jsonpath={.status.output.value}")
        print()

        say("Now a slow job: its writer calls the sample `notify` tool (it stands for a "
            "message sent to the team), which takes 90 s to answer. Every tool call is "
            "journaled BEFORE it runs, with an idempotency key the tool receives. While the "
            "call is in flight we kill the pod the hard way. A sidecar that dies mid-job "
            "cannot know what its tool did, so crewfence must NOT report success or failure "
            "as fact, must NOT run the job again, and must say which call is in doubt.")
        running = step("Applying examples/crewjob-slow.yaml and waiting until it runs", lambda: (
            show(cluster, "apply", "-n", NAMESPACE, "-f", str(EXAMPLES / "crewjob-slow.yaml")),
            wait_phase(cluster, NAMESPACE, "crewjob-slow", ("Running",), timeout=300))[1])
        folder = plugin_dir(STATE_DIR)
        step("Waiting until the journal shows the notify call started (kubectl crewfence logs)",
             lambda: wait_for(lambda: "STARTED" in kubectl_plugin(
                 cluster, folder, "logs", "crewjob-slow", "-n", NAMESPACE).stdout,
                 timeout=300, what="the notify call to start"))
        plugin(cluster, folder, "logs", "crewjob-slow", "-n", NAMESPACE)
        pod = running["status"]["assignment"]["pod"]
        step(f"Killing pod {pod}: kubectl delete pod --force --grace-period=0", lambda: show(
            cluster, "delete", "pod", pod, "-n", NAMESPACE, "--force", "--grace-period=0"))
        final = step("Waiting for the operator to report the outcome", lambda: _expect(
            wait_phase(cluster, NAMESPACE, "crewjob-slow", timeout=300), "Failed",
            uncertain=True))
        show(cluster, "get", "crewjobs", "-n", NAMESPACE)
        cond = condition(final, "OutcomeUncertain") or {}
        say(f"Condition OutcomeUncertain={cond.get('status')} reason={cond.get('reason')}: "
            f"{cond.get('message')}")
        say(f"status.recovery: {final['status'].get('recovery')}")
        effects = final["status"].get("effects") or {}
        doubt = effects.get("inDoubt") or []
        if not doubt:
            raise StepFailed("the uncertain job names no tool call in doubt")
        say(f"status.effects: {effects.get('toolCalls')} tool call(s), "
            f"{effects.get('inDoubtCount')} in doubt: `{doubt[0]['tool']}` in task "
            f"`{doubt[0]['task']}`, idempotency key {doubt[0]['idempotencyKey']} (the key the "
            "tool received: ask the system it talks to whether that key was used).")
        warnings = [e for e in events_for(cluster, NAMESPACE, "crewjob-slow")
                    if e.get("type") == "Warning"]
        for ev in warnings:
            say(f"Warning Event {ev.get('reason')}: {ev.get('message')}")
        if not warnings:
            raise StepFailed("no Warning Event was recorded for the uncertain outcome")
        say("The job stays Failed with uncertainOutcome=true; nothing re-ran it. Reconcile "
            "external effects before creating a new CrewJob.")
        close_the_loop(cluster)
        print("\nDemo finished: every step succeeded.", flush=True)
        return 0
    finally:
        if keep:
            say(f"Cluster left running (--keep). Stop it with: python tests/e2e/cluster.py "
                f"down --state-dir {STATE_DIR}")
        else:
            print("\n==> Cleaning up: stopping everything the demo started", flush=True)
            stopped = controlplane.down(STATE_DIR)
            print(f"    stopped: {', '.join(stopped) or 'nothing'}", flush=True)


def plugin(cluster: Cluster, folder: Path, *args: str) -> str:
    result = kubectl_plugin(cluster, folder, *args)
    text = (result.stdout or result.stderr).rstrip()
    print(textwrap.indent(f"$ kubectl crewfence {' '.join(args)}\n{text}", "    "), flush=True)
    if result.returncode != 0:
        raise StepFailed(f"kubectl crewfence {' '.join(args)} failed")
    return text


def close_the_loop(cluster: Cluster) -> None:
    """The human half: find, explain, resolve with the kubectl plugin, resume once."""
    folder = plugin_dir(STATE_DIR)
    say("A person closes the loop with the kubectl plugin (kubectl-crewfence on the PATH): "
        "find the unresolved uncertain outcomes, read the evidence, record the finding.")
    plugin(cluster, folder, "uncertain", "-n", NAMESPACE)
    plugin(cluster, folder, "explain", "crewjob-slow", "-n", NAMESPACE)
    say("Suppose the provider's logs show no request for this action id: the work did not "
        "happen. The resolution is recorded once (the API server refuses a second one), in "
        "the CrewJob's status, in an Event and in the sidecar's journal; the phase stays.")
    step("Resolving crewjob-slow as NotHappened", lambda: plugin(
        cluster, folder, "resolve", "crewjob-slow", "-n", NAMESPACE, "--not-happened",
        "--note", "demo: no provider request for this action id in the logs"))
    show(cluster, "get", "crewjobs", "-n", NAMESPACE)
    say("Only a linked successor (spec.supersedes) may run that work again, and only once. "
        "With --resume it continues the journaled trajectory instead of starting over (the "
        "Crew journals resume material: task outputs, tool results, model responses): the "
        "research task is not run again, the model call that asked for notify is answered "
        "from the journal (no second bill), and the notify call in doubt runs again with the "
        "SAME idempotency key, because it was resolved NotHappened.")
    step("kubectl crewfence rerun crewjob-slow --resume", lambda: plugin(
        cluster, folder, "rerun", "crewjob-slow", "-n", NAMESPACE, "--resume"))
    running = step("Waiting until the operator admits the successor crewjob-slow-rerun",
                   lambda: wait_phase(cluster, NAMESPACE, "crewjob-slow-rerun",
                                      ("Running", "Succeeded"), timeout=300))
    again = kubectl_plugin(cluster, folder, "rerun", "crewjob-slow", "-n", NAMESPACE,
                           "--resume")
    if again.returncode == 0:
        raise StepFailed("a second rerun of crewjob-slow was accepted")
    say(f"A second rerun is refused: {again.stderr.strip()}")
    where = running["status"].get("assignment") or {}
    say(f"crewjob-slow-rerun runs once, under its own action id "
        f"{running['status']['actionId']}, on replica {where.get('ordinal')} (the replica "
        "whose journal holds crewjob-slow's trajectory). Its notify call waits 90 s again.")
    successor = step("Waiting for crewjob-slow-rerun to succeed", lambda: _expect(
        wait_phase(cluster, NAMESPACE, "crewjob-slow-rerun", timeout=400), "Succeeded",
        uncertain=False))
    show(cluster, "get", "crewjobs", "-n", NAMESPACE)
    effects = successor["status"].get("effects") or {}
    reused = effects.get("reused") or {}
    links = successor["status"].get("supersedes") or {}
    say(f"It supersedes {links.get('name')} (resolved {links.get('outcome')}). "
        f"status.effects.reused, taken from {reused.get('fromActionId')}'s journal: "
        f"{reused.get('tasks')} task(s), {reused.get('toolCalls')} tool call(s), "
        f"{reused.get('modelCalls')} model call(s). Ran live: {effects.get('tasksCompleted')} "
        f"task(s), {effects.get('toolCalls')} tool call(s), {effects.get('modelCalls')} model "
        "call(s).")
    if not reused.get("tasks") or not reused.get("modelCalls"):
        raise StepFailed(f"the resume reused nothing: {json.dumps(effects)}")
    plugin(cluster, folder, "explain", "crewjob-slow-rerun", "-n", NAMESPACE)
    show(cluster, "get", "crewjob", "crewjob-slow", "-n", NAMESPACE,
         "-o", "jsonpath={.status.supersededBy}")
    print()


def _expect(obj: dict[str, Any], phase: str, *, uncertain: bool) -> dict[str, Any]:
    status = obj.get("status") or {}
    if status.get("phase") != phase or bool(status.get("uncertainOutcome")) != uncertain:
        seen = {k: status.get(k) for k in ("phase", "reason", "message", "uncertainOutcome")}
        raise StepFailed(f"expected {phase} (uncertain={uncertain}), got {json.dumps(seen)}")
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    try:
        return run_demo(args.keep)
    except StepFailed as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    except build.BuildError as exc:
        print(f"\nDEMO FAILED: cannot build the control plane: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
