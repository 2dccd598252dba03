"""The user docs stay tied to what they describe: the reference's recovery table, the operator's
uncertain reasons, the metric names, and their own links."""

from __future__ import annotations

import re

import pytest
from chart_helpers import REPO

DOCS = REPO / "docs"
REFERENCE = (
    REPO.parent / "shared" / "reference" / "crewai-idempotency-cancellation-and-process-fencing.md"
)
REQUIRED = [
    "concepts.md",
    "install.md",
    "recovery-runbook.md",
    "troubleshooting.md",
    "gitops-argocd.md",
    "gitops-flux.md",
    "observability.md",
]


def test_required_docs_exist() -> None:
    missing = [name for name in REQUIRED if not (DOCS / name).is_file()]
    assert not missing


def recovery_table_evidence() -> list[str]:
    if not REFERENCE.is_file():
        pytest.skip(f"the reference is not beside the repository ({REFERENCE})")
    text = REFERENCE.read_text()
    section = text.split("## Choose a recovery action", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")][2:]
    return [row.split("|")[1].strip() for row in rows]


def test_runbook_covers_every_row_of_the_reference_recovery_table() -> None:
    runbook = (DOCS / "recovery-runbook.md").read_text()
    evidence = recovery_table_evidence()
    assert len(evidence) >= 8
    missing = [e for e in evidence if e not in runbook]
    assert not missing, missing


def test_runbook_explains_every_uncertain_reason() -> None:
    from crewfence_operator.crewjob.outcome import UNCERTAIN_REASONS

    runbook = (DOCS / "recovery-runbook.md").read_text()
    assert UNCERTAIN_REASONS
    assert not [str(r) for r in UNCERTAIN_REASONS if str(r) not in runbook]


def test_runbook_uses_the_journal_commands() -> None:
    runbook = (DOCS / "recovery-runbook.md").read_text()
    for command in (
        "crewfence journal inspect",
        "crewfence journal export",
        "crewfence journal archive",
    ):
        assert command in runbook


def test_observability_lists_every_dashboard_metric() -> None:
    import json

    dashboard = json.loads((REPO / "charts/crewfence/files/dashboards/crewfence.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = {
        re.sub(r"_(bucket|sum|count)$", "", m)
        for e in exprs
        for m in re.findall(r"\bcrewfence_[a-z0-9_]+\b", e)
    }
    text = (DOCS / "observability.md").read_text()
    assert not [n for n in sorted(names) if f"`{n}`" not in text]


@pytest.mark.parametrize("doc", REQUIRED)
def test_relative_links_resolve(doc: str) -> None:
    text = (DOCS / doc).read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (DOCS / target).exists(), f"{doc} links to missing {target}"


def test_argocd_doc_names_the_health_keys() -> None:
    text = (DOCS / "gitops-argocd.md").read_text()
    assert "resource.customizations.health.crewfence.dev_CrewJob" in text
    assert "TTL" in text and "<namespace>/<name>" in text


def test_flux_doc_has_health_check_exprs_for_both_kinds() -> None:
    text = (DOCS / "gitops-flux.md").read_text()
    assert "healthCheckExprs" in text
    assert re.search(r"kind: CrewJob", text) and re.search(r"kind: Crew\n", text)
    assert "Reconciling" in text and "Stalled" in text


def test_the_tools_doc_shows_the_example_manifest_as_it_is() -> None:
    """docs/tools.md's complete example is examples/crew-tools.yaml itself (the e2e tests and
    kubectl apply the file; the page must not drift from it)."""
    doc = (REPO / "docs" / "tools.md").read_text(encoding="utf-8")
    example = (REPO / "examples" / "crew-tools.yaml").read_text(encoding="utf-8")
    assert f"```yaml\n{example}```\n" in doc
