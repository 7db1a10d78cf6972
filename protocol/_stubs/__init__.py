"""Type stubs of the protocol's generated modules (`*.pyi`), for the type checker only.

`protocol.pb` loads the modules themselves from rocketmq-python-client, which ships them
untyped, and `protocol.ext` builds its message at run time; both import these stubs under
`TYPE_CHECKING` alone: nothing here exists at run time. scripts/protocol_stubs.py makes
them from the descriptors the runtime registers, and tests/unit/test_protocol_stubs.py
fails when the two disagree.
"""
