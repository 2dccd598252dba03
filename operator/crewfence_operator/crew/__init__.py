"""Crew domain: pure functions from a Crew object to the manifests and status it implies
(``audit.py`` also posts the shared-state audit's Events). Transport security (certificates,
the Crew CA, the token roll) is ``crewfence_operator/transport/``, which this package uses."""
