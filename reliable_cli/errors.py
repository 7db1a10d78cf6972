"""The command line's own errors, under the client library's one root.

A command catches these at its edge and turns them into a line on stderr and a named exit
code (`reliable_cli.exit_codes`).
"""

from __future__ import annotations

from reliable.errors import ReliableError


class CommandError(ReliableError):
    """Root of the errors a `reliable` command raises itself."""


class TargetError(CommandError):
    """A `module:attr` target could not be loaded, or is not what the command needs."""
