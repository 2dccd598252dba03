"""``kubectl crewfence logs JOB [-f]``: a CrewJob's journaled events, one line each, as
``kubectl logs job/x`` shows a Job's output; ``-f`` follows until the record ends.

Read from the assigned replica's journal the way ``explain`` reads it (``sidecar.py``: the
Crew's token and client certificate, the replica's name verified), so what is printed is
the journal itself, not a copy in status.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

import aiohttp

from crewfence_operator.crewjob import supersede
from crewfence_operator.kubectl.client import Kube, PluginError, get_job
from crewfence_operator.kubectl.sidecar import (
    EvidenceUnavailable,
    SidecarAccess,
    job_access,
    sidecar_client,
)
from crewfence_operator.kubectl.timeline import event_line
from crewfence_operator.sidecar_client import SidecarFailure

NAME = "logs"
HELP = "print a CrewJob's journaled events (-f: follow until it ends)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep printing events until the job's record ends")


async def print_events(access: SidecarAccess, action_id: str, *, follow: bool,
                       out: Callable[[str], None]) -> None:
    """Page the events from 0 (and, following, stream the rest until the record ends)."""
    async with aiohttp.ClientSession() as session:
        client = sidecar_client(session, access)
        cursor = 0
        while True:
            page = await client.events_page(action_id, cursor)
            for event in page.events:
                out(event_line(event.to_wire()))
            cursor = page.next_cursor
            if page.events:
                continue  # another page may follow
            if not follow or page.status.value != "running":
                return
            async for event in client.follow(action_id, cursor):
                out(event_line(event.to_wire()))
                cursor = event.sequence + 1


def run(args: argparse.Namespace, kube: Kube) -> int:
    obj = get_job(kube, args.job)
    try:
        access = job_access(kube, obj)
        asyncio.run(print_events(access, supersede.effective_action_id(obj),
                                 follow=args.follow, out=lambda line: print(line, flush=True)))
    except EvidenceUnavailable as exc:
        raise PluginError(f"cannot read the journal of {args.job}: {exc}") from None
    except SidecarFailure as exc:
        raise PluginError(f"the sidecar at {access.address} answered: {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise PluginError(f"the sidecar could not be asked: {type(exc).__name__}") from None
    return 0
