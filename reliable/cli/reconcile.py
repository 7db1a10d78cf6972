"""`reliable reconcile`: the Spark audit of stubs against the consumption log.

Defined by `outbox.reconcile.command` (the same options serve `spark-submit`); PySpark is
imported only when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from outbox.reconcile.command import add_arguments, run

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reconcile",
        help="prove every outbox message was consumed; report and repair what was not",
        description="Reconcile message stubs with confirmations and the consumption log "
                    "(PySpark; local[*] by default). Exit 0: the window is clean; 3: it has "
                    "unaccounted messages; 1: failure; 2: bad options; 4: source unreadable.")
    add_arguments(parser)
    parser.set_defaults(handler=run)
