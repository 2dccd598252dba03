"""CrewJob domain logic, free of kopf and of API calls: spec parsing, status building,
failure mapping, recovery words, output bounding and kstatus conditions."""
