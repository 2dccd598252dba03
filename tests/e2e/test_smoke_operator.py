"""The harness runs `crewfence-operator` as a real process against the cluster."""

from __future__ import annotations

import urllib.request

from harness.handles import Operator


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return int(resp.status), resp.read().decode()


def test_operator_process_serves_liveness_and_metrics(operator_process: Operator) -> None:
    assert operator_process.alive()
    status, _ = _get(operator_process.launch.liveness_url)
    assert status == 200
    status, body = _get(operator_process.metrics_url)
    assert status == 200
    assert "crewfence_operator_" in body


def test_operator_can_be_killed_and_started_again(operator_process: Operator) -> None:
    before = operator_process.record
    operator_process.kill()
    assert not operator_process.alive()
    operator_process.start()
    assert operator_process.alive()
    after = operator_process.record
    assert before is not None and after is not None and after.pid != before.pid
    status, _ = _get(operator_process.launch.liveness_url)
    assert status == 200
