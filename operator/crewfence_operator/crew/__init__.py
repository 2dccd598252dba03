"""Crew domain: pure functions from a Crew object to the manifests and status it implies."""
