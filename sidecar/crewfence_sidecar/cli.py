"""`crewfence-sidecar`: the per-pod server.

Start-up order: configuration -> journal fence and restore -> crews (imports crewai) -> bind.
Any refusal before the bind prints ONE line on stderr and exits 2; the port is never bound.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from crewfence_sidecar.config import ConfigError, load_config
from crewfence_sidecar.fencing import FencingError
from crewfence_sidecar.journal import JournalError
from crewfence_sidecar.logs import setup_logging

EXIT_CONFIG = 2


def _refuse(message: str) -> int:
    print(f"crewfence-sidecar: error: {message}", file=sys.stderr, flush=True)
    return EXIT_CONFIG


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load_config(argv)
    except ConfigError as exc:
        return _refuse(str(exc))
    except SystemExit as exc:  # --help
        return int(exc.code or 0)

    from crewfence_sidecar.crewai_outputs_holder import hold as hold_crewai_outputs
    from crewfence_sidecar.server import (
        StartupError,
        open_journal,
        prepare_process_environment,
        serve,
    )
    from crewfence_sidecar.workers.settings import template_settings
    from crewfence_sidecar.workers.supervisor import Supervisor, TemplateError

    setup_logging(config.log_level)
    try:
        prepare_process_environment(config)
    except OSError as exc:
        return _refuse(f"cannot prepare the process environment: {exc.strerror}")
    # The worker template is forked now, while this process has one thread and no event
    # loop; it imports crewai and the crews while the journal is fenced and restored here.
    supervisor = Supervisor.fork_template(template_settings(config))
    try:
        opened = open_journal(config)
    except (FencingError, JournalError) as exc:
        supervisor.close_sync()
        return _refuse(str(exc))
    try:
        supervisor.wait_ready()
    except TemplateError as exc:
        opened.close()
        supervisor.close_sync()
        return _refuse(str(exc))
    # only now, the template forked: no worker inherits this SQLite connection
    outputs = hold_crewai_outputs()
    try:
        asyncio.run(serve(config, None, opened, supervisor))
    except StartupError as exc:
        opened.close()
        return _refuse(str(exc))
    except KeyboardInterrupt:
        opened.close()
    finally:
        if outputs is not None:
            outputs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
