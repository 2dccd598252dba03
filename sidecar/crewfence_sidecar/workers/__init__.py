"""Job workers: one process per running job, forked from a warm template process.

- :mod:`.protocol` — frames on the per-job channel and control messages (no crewai).
- :mod:`.template` — the template process: imports crewai and the crews once, then forks one
  worker per job from its single thread (never from the sidecar's event loop).
- :mod:`.worker` — what a forked worker does: its own process group, limits, the operation,
  chunks and the result back over its channel. Workers never touch the journal.
- :mod:`.supervisor` — the sidecar's side: asks the template to fork, reads the channel,
  stops a worker's process group (SIGTERM, grace, SIGKILL) and learns when it was reaped.
- :mod:`.executor` — the runtime's ``Executor`` built on the supervisor.
"""
