"""Named exit codes shared by every `reliable` sub-command."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1  # the command ran and failed
    USAGE = 2  # bad command line (argparse uses 2 as well)
    UNACCOUNTED = 3  # reconciliation: the window has unaccounted messages
    UNAVAILABLE = 4  # a service (database, Redis, broker) could not be reached
    MANUAL_HANDLING = 5  # reconciliation: nothing lost, but escalated messages await an operator
    INTERRUPTED = 130
    OUTPUT_CLOSED = 141  # stdout's reader went away (`| head`): 128 + SIGPIPE, as a shell says
