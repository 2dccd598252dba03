"""A Jepsen-style fault campaign on the real control plane (issue 19, part 2).

``schedule`` (seeded, pure) says what to do, ``faults`` does it against a live cluster and
records a ``history``, ``checker`` (pure) turns the history into anomalies. The e2e test
``tests/e2e/test_fault_campaign.py`` runs a short campaign, ``tests/bench/
bench_fault_campaign.py`` a long one; docs/reliability.md reports the figures.
"""
