"""``kubectl crewfence trigger CRONJOB``: one manual run of a CrewCronJob, under its own
action id (``cronjob/trigger.py`` decides the name and the action id; this verb only calls it).
"""

from __future__ import annotations

import argparse

from crewfence_operator.cronjob.trigger import TriggerError
from crewfence_operator.cronjob.trigger import trigger as trigger_run
from crewfence_operator.kubectl.client import Kube, PluginError

NAME = "trigger"
HELP = "start one manual run of a CrewCronJob (its own action id)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cronjob", help="the CrewCronJob's name")


def run(args: argparse.Namespace, kube: Kube) -> int:
    try:
        result = trigger_run(kube.api, kube.namespace, args.cronjob)
    except TriggerError as exc:
        raise PluginError(str(exc)) from None
    print(result.message(kube.namespace))
    return 0
