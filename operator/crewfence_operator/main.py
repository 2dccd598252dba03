"""The operator's kopf entry: importing this module registers every handler.

``crewfence-operator`` (cli.py) sets the configuration first; ``kopf run -m
crewfence_operator.main`` works too and reads the configuration from the environment.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from crewfence_operator import config, persistence, readiness
from crewfence_operator import constants as c
from crewfence_operator.handlers import (
    crew,
    crewcronjob,
    crewjob,
    kueue,
    resolution,
    ttl,
    webhook,
)
from crewfence_operator.transport import certs

__all__ = ["crew", "crewcronjob", "crewjob", "kueue", "resolution", "ttl", "webhook"]

if config.current().webhook.mode is not config.WebhookMode.OFF:
    webhook.register()


def apply_settings(settings: kopf.OperatorSettings, cfg: config.OperatorConfig,
                   webhook_files: certs.CertFiles | None = None) -> None:
    """kopf identity under crewfence.dev, chosen once (it is stored on every object)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.KOPF_PREFIX)
    # No diff base on CrewJobs: one API write per CrewJob that nothing reads (persistence.py).
    settings.persistence.diffbase_storage = persistence.DiffBaseExceptCrewJobs(
        prefix=c.KOPF_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = c.FINALIZER
    if not cfg.standalone:
        settings.peering.name = cfg.peering_name
        settings.peering.mandatory = True
    settings.peering.priority = cfg.priority
    settings.peering.standalone = cfg.standalone
    # Handler log lines become Events at or above this level; INFO would post one Event per
    # handler run (API writes). kopf.warn/kopf.event calls are posted regardless.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    webhook.configure(settings, cfg.webhook, webhook_files)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    cfg = config.current()
    # Certificate and (out of cluster) the admission policies/configuration: blocking API calls.
    files = await asyncio.to_thread(webhook.prepare, cfg)
    apply_settings(settings, cfg, files)
    await readiness.start(cfg)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await readiness.stop()
