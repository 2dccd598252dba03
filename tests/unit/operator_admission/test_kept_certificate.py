"""When the operator reuses the webhook certificate it keeps in a Secret, and when it renews it
(the e2e test tests/e2e/test_chart_webhook.py runs the whole keeper against the API server)."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

from crewfence_operator import admission_install
from crewfence_operator.transport import certs

NAMES = admission_install.service_dns_names("cf-crewfence-webhook", "crewfence-system")
NOW = dt.datetime.now(dt.UTC)


def _data(tmp_path: Path, hosts: list[str], days: int) -> dict[str, str]:
    files = certs.generate(tmp_path, hosts, days=days)
    return {k: base64.b64encode(p.read_bytes()).decode() for k, p in
            (("tls.crt", files.cert), ("tls.key", files.key), ("ca.crt", files.ca))}


def test_a_valid_certificate_for_the_service_is_reused(tmp_path: Path) -> None:
    assert admission_install.usable(_data(tmp_path, NAMES, 365), NAMES, NOW)


def test_near_expiry_other_names_or_garbage_is_renewed(tmp_path: Path) -> None:
    assert not admission_install.usable(_data(tmp_path / "a", NAMES, 29), NAMES, NOW)
    assert not admission_install.usable(_data(tmp_path / "b", ["other.svc"], 365), NAMES, NOW)
    assert not admission_install.usable({}, NAMES, NOW)
    assert not admission_install.usable(
        {"tls.crt": "bm90IGEgY2VydA==", "tls.key": "", "ca.crt": ""}, NAMES, NOW)
