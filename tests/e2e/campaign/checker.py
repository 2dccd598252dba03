"""The checker: a campaign's history in, anomalies out. Pure (no cluster, no clock).

The checks, each the negation of one promise of issue 19 ("at most once for the Crew's whole
life"):

- ``at_most_once``: every action executed at most once, counted outside every journal (the
  offline LLM's ledger: one ``Research <token> ...`` call per execution of a research job).
  A token is shared by a job and the successors ``kubectl crewfence rerun`` made of it (a
  rerun copies the input), so a token may run once plus once per admitted successor.
- ``one_successor``: at most one successor admitted per predecessor.
- ``successor_gate``: a successor admitted only for a predecessor resolved NotHappened or
  Compensated.
- ``verdict_while_running``: no certain terminal verdict (Succeeded/Failed/Cancelled without
  an uncertain outcome) while the sidecar's record of that action on the assigned replica was
  still running (a record sampled running after the verdict was sampled).
- ``ledger_blind``: the ledger must see every job that succeeded (else the count above would
  prove nothing).
- ``resolution_consistent``: one action, one finding: every resolution accepted for an action
  id (across the CrewJob objects that carried it: delete and re-apply) is the same.
- ``uncertain_visible``: every uncertain outcome visible three ways: ``status.uncertainOutcome``
  with the OutcomeUncertain condition, a Warning Event (reason OutcomeUncertain*) on that
  CrewJob, and the operator's gauge of unresolved uncertain CrewJobs matching the objects.

A check that fires only because of a gap known and being worked on carries ``known_gap`` (the
e2e test reports it without failing; remove the classification once the gap is closed). None
is classified so today: the resolution and the one-successor claim are journal facts (the
successor gate reads only the journal), and a re-applied predecessor's status shows only the
journal's finding (``crewjob/resolution.py``: status shows only a confirmed finding), so two
resolutions of one action, or two successors of a re-created predecessor, are hard anomalies.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from campaign.history import History, JobSample

RESOLVED_FOR_SUCCESSOR = frozenset({"NotHappened", "Compensated"})
UNCERTAIN_CONDITION = "OutcomeUncertain"


@dataclass(frozen=True)
class Anomaly:
    check: str
    subject: str
    detail: str
    known_gap: str = ""

    def __str__(self) -> str:
        known = f" (known gap: {self.known_gap})" if self.known_gap else ""
        return f"[{self.check}] {self.subject}: {self.detail}{known}"


def _incarnations(history: History) -> dict[str, set[str]]:
    """CrewJob name -> the uids of the objects seen under it (more than one: re-created)."""
    out: dict[str, set[str]] = defaultdict(set)
    for sample in [*history.jobs, *history.final_jobs]:
        out[sample.name].add(sample.uid)
    return out


def executions(history: History, token: str) -> int:
    """Executions of jobs carrying ``token``: their first task's model calls."""
    prefix = f"Research {token} "
    return sum(1 for task in history.ledger if task.startswith(prefix))


def _admitted(history: History) -> dict[str, JobSample]:
    """name -> the first sample showing the job admitted."""
    first: dict[str, JobSample] = {}
    for sample in [*history.jobs, *history.final_jobs]:
        if sample.admitted and sample.name not in first:
            first[sample.name] = sample
    return first


def _successors(history: History) -> dict[str, set[str]]:
    """predecessor name -> names of the successors that were admitted."""
    admitted = _admitted(history)
    out: dict[str, set[str]] = defaultdict(set)
    for sample in [*history.jobs, *history.final_jobs]:
        if sample.supersedes and sample.name in admitted:
            out[sample.supersedes].add(sample.name)
    return out


def at_most_once(history: History) -> list[Anomaly]:
    successors = {s for names in _successors(history).values() for s in names}
    family: dict[str, list[str]] = defaultdict(list)
    for name, token in history.tokens.items():
        family[token].append(name)
    found = []
    for token, names in sorted(family.items()):
        allowed = 1 + sum(1 for n in names if n in successors)
        ran = executions(history, token)
        if ran > allowed:
            found.append(Anomaly("at_most_once", ",".join(sorted(names)),
                                 f"executed {ran} times, at most {allowed} allowed "
                                 f"(token {token})"))
    return found


def one_successor(history: History) -> list[Anomaly]:
    recreated = {n for n, uids in _incarnations(history).items() if len(uids) > 1}
    return [Anomaly("one_successor", pred, f"{len(names)} successors admitted: "
                    f"{', '.join(sorted(names))}"
                    + (" (the predecessor was re-created)" if pred in recreated else ""))
            for pred, names in sorted(_successors(history).items()) if len(names) > 1]


def resolution_consistent(history: History) -> list[Anomaly]:
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for sample in [*history.jobs, *history.final_jobs]:
        if sample.resolution:
            found[sample.action_id or sample.name].setdefault(sample.uid, sample.resolution)
    return [Anomaly("resolution_consistent", action,
                    "resolved differently by its CrewJob objects: "
                    + ", ".join(f"{uid[:8]}={res}" for uid, res in by_uid.items()))
            for action, by_uid in sorted(found.items()) if len(set(by_uid.values())) > 1]


def successor_gate(history: History) -> list[Anomaly]:
    resolutions: dict[str, set[str]] = defaultdict(set)
    for sample in [*history.jobs, *history.final_jobs]:
        if sample.resolution:
            resolutions[sample.name].add(sample.resolution)
    found = []
    for pred, names in sorted(_successors(history).items()):
        if not resolutions[pred] & RESOLVED_FOR_SUCCESSOR:
            seen = ", ".join(sorted(resolutions[pred])) or "never resolved"
            found.append(Anomaly("successor_gate", pred,
                                 f"successor(s) {', '.join(sorted(names))} admitted; "
                                 f"predecessor resolutions seen: {seen}"))
    return found


def verdict_while_running(history: History) -> list[Anomaly]:
    found, reported = [], set()
    for job in history.jobs:
        if not job.terminal or job.uncertain or job.ordinal is None or job.uid in reported:
            continue
        for rec in history.records:
            if (rec.action_id == job.action_id and rec.ordinal == job.ordinal
                    and rec.t > job.t and rec.status == "running"):
                reported.add(job.uid)
                found.append(Anomaly(
                    "verdict_while_running", job.name,
                    f"{job.phase}/{job.reason} (certain) at {job.t:.1f}s, record on replica "
                    f"{rec.ordinal} still running at {rec.t:.1f}s"))
                break
    return found


def uncertain_visible(history: History) -> list[Anomaly]:
    found = []
    warned = {e.uid for e in history.events
              if e.type == "Warning" and e.reason.startswith(UNCERTAIN_CONDITION)}
    unresolved = 0
    for job in history.final_jobs:
        cond = job.condition(UNCERTAIN_CONDITION)
        if not job.uncertain:
            if cond is not None and cond[0] == "True":
                found.append(Anomaly("uncertain_visible", job.name,
                                     "OutcomeUncertain=True but status.uncertainOutcome false"))
            continue
        if not job.resolution:
            unresolved += 1
        if cond is None or (not job.resolution and cond[0] != "True"):
            found.append(Anomaly("uncertain_visible", job.name,
                                 f"uncertain but condition OutcomeUncertain is {cond}"))
        if job.uid not in warned:
            found.append(Anomaly("uncertain_visible", job.name,
                                 "uncertain but no Warning Event OutcomeUncertain*"))
    gauge = sum(history.unresolved_gauge.values())
    if gauge != unresolved:
        found.append(Anomaly("uncertain_visible", history.namespace,
                             f"gauge of unresolved uncertain CrewJobs says {gauge:g}, "
                             f"the objects say {unresolved}"))
    return found


def ledger_blind(history: History) -> list[Anomaly]:
    return [Anomaly("ledger_blind", job.name, "Succeeded, but the ledger holds no execution "
                    f"of token {history.tokens.get(job.name)}")
            for job in history.final_jobs
            if job.phase == "Succeeded" and job.name in history.tokens
            and executions(history, history.tokens[job.name]) == 0]


CHECKS = (at_most_once, ledger_blind, one_successor, resolution_consistent, successor_gate,
          verdict_while_running, uncertain_visible)


def check(history: History) -> list[Anomaly]:
    """Every anomaly in ``history``, check by check (known gaps included, marked)."""
    return [a for chk in CHECKS for a in chk(history)]


def hard(anomalies: list[Anomaly]) -> list[Anomaly]:
    """The anomalies that are not explained by a known gap."""
    return [a for a in anomalies if not a.known_gap]
