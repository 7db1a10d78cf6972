"""The protocol's generated modules (`*_pb2`), loaded from the official client package.

The one loader for both sides of the wire: `broker.server` serves with these modules and
`reliable.transport` (through `reliable.transport._pb`) calls with them. It imports nothing
else of the project, so the framework can use it without loading the broker.

`rocketmq-python-client` ships the generated `apache.rocketmq.v2` modules in
`rocketmq.grpc_protocol`, but importing anything under `rocketmq` first runs the client's
package `__init__`, which creates `~/logs/rocketmq_python/` and installs a logging
configuration. Neither the server nor the framework's gRPC transport has any business doing
either, so the stubs are loaded under a temporary shell package; a later `import rocketmq`
(say, by the official client in the same process) loads the real package and reuses the same
stub modules.

The client package ships the modules without types: the type checker reads the stubs in
`protocol._stubs` instead (scripts/protocol_stubs.py makes them from these modules'
descriptors).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

_HINT = (
    "the RocketMQ 5 protocol stubs come with rocketmq-python-client: "
    "pip install 'rocketmq-python-client==5.1.2'"
)


def _load() -> tuple[types.ModuleType, ...]:
    names = ("definition_pb2", "service_pb2", "service_pb2_grpc")
    if "rocketmq" in sys.modules:
        return tuple(importlib.import_module(f"rocketmq.grpc_protocol.{n}") for n in names)
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(_HINT)
    shell = types.ModuleType("rocketmq")
    shell.__path__ = list(spec.submodule_search_locations)
    sys.modules["rocketmq"] = shell
    try:
        # import the generated modules directly: the stub package's own __init__ is harmless
        # but the shell keeps the client's __init__ from running
        return tuple(importlib.import_module(f"rocketmq.grpc_protocol.{n}") for n in names)
    except ImportError as exc:
        raise ImportError(_HINT) from exc
    finally:
        # forget the shell and the modules loaded through it: the real package, if ever
        # imported, loads its own copies (the descriptors are identical, so they coexist)
        for name in [n for n in sys.modules if n == "rocketmq" or n.startswith("rocketmq.")]:
            del sys.modules[name]


if TYPE_CHECKING:
    from protocol._stubs import definition_pb2, service_pb2, service_pb2_grpc
else:
    definition_pb2, service_pb2, service_pb2_grpc = _load()

__all__ = ["definition_pb2", "service_pb2", "service_pb2_grpc"]
