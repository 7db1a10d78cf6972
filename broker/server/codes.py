"""The protocol's status codes, for the server's modules: `Code` is defined once, in
`broker.codes`, with the table of what each code means to a client."""

from __future__ import annotations

from broker.codes import Code

__all__ = ["Code"]
