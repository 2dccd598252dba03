"""Transport security between the operator and a Crew's sidecars (and the webhook's serving
certificate): certificates, the per-Crew CA and its rotation, cert-manager as the other
certificate source, and the bearer token's roll. The Crew domain (``crew/``) uses it; it uses
nothing of ``crew/`` but ``crew/identity.py`` (a Crew's name, labels and owner reference)."""
