"""The protocol's status codes, for the server's modules: `Code` is defined once, in
`protocol.codes`, with the table of what each code means to a client."""

from __future__ import annotations

from protocol.codes import Code

__all__ = ["Code"]
