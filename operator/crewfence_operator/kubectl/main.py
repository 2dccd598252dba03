"""The ``kubectl-crewfence`` entry point: kubectl's flags, one sub-command per verb module.

A verb is a module with ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args, kube) -> int``; adding one is that module and one entry in ``VERBS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Protocol

from crewfence_operator.kubectl import explain, logs, rerun, resolve, trigger, uncertain
from crewfence_operator.kubectl.client import Kube, PluginError, connect, kubectl_flags


class Verb(Protocol):
    """What ``main`` needs of a verb module."""

    NAME: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, kube: Kube) -> int: ...


VERBS: tuple[Verb, ...] = (uncertain, explain, logs, resolve, rerun, trigger)


def build_parser() -> argparse.ArgumentParser:
    common = kubectl_flags(top=False)
    parser = argparse.ArgumentParser(
        prog="kubectl crewfence", parents=[kubectl_flags(top=True)],
        description="Find, explain, resolve and rerun CrewJobs whose outcome is uncertain; "
                    "trigger a CrewCronJob.")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in VERBS:
        verb.add_arguments(sub.add_parser(verb.NAME, parents=[common], help=verb.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    verbs = {verb.NAME: verb for verb in VERBS}
    try:
        kube = connect(args)
        return verbs[args.command].run(args, kube)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
