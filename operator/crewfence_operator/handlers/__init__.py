"""kopf handler modules; importing one registers its handlers."""
