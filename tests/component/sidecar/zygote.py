"""A pre-warmed parent that forks real `crewfence-sidecar` processes for the crash test.

Importing crewai takes 5-10 s on this machine; the crash test needs 50+ restarts. This
process imports the sidecar (and crewai) once, then forks a child per request that runs the
unmodified ``crewfence_sidecar.cli.main`` with its own environment and stderr file. The
children are real processes: the test SIGKILLs them by pid, and their journal, flock and
SQLite files are real. Protocol: one JSON object per line on stdin/stdout.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.update({"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false",
                   "OTEL_SDK_DISABLED": "true", "CREWAI_DISABLE_TRACKING": "true"})

import crewfence_sidecar.cli
import crewfence_sidecar.crews
import crewfence_sidecar.operations
import crewfence_sidecar.server


def _child(argv: list[str], env: dict[str, str], log: str) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(err, 2)
    os.close(devnull)
    os.close(err)
    os.environ.clear()
    os.environ.update(env)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    code = 1
    try:
        code = crewfence_sidecar.cli.main(argv)
    finally:
        os._exit(code)


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _child(msg["argv"], msg["env"], msg["log"])
            print(json.dumps({"pid": pid}), flush=True)
        elif msg["cmd"] == "wait":
            _, status = os.waitpid(int(msg["pid"]), 0)
            print(json.dumps({"status": status}), flush=True)
        elif msg["cmd"] == "exit":
            return


if __name__ == "__main__":
    main()
