"""`module:attr` targets: how a command is pointed at user code (handlers, a sender, ...).

The one loader for every command. The module is imported with the working directory on the
import path, as `python -m` would, since the console script puts only its own directory
there; `attr` may be dotted (`module:factory.build`).
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from reliable_cli.errors import TargetError


def import_module(target: str, module_name: str) -> ModuleType:
    """Import `module_name` for `target`; TargetError when it cannot be imported."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"{target}: cannot import {module_name!r}: {exc}") from exc


def resolve(target: str, *, attr_required: bool = True) -> tuple[ModuleType, Any]:
    """`(module, object)` for `module:attr`; with `attr_required=False`, `module` alone
    gives `(module, None)`."""
    module_name, _, attr = target.partition(":")
    if not module_name or (attr_required and not attr):
        raise TargetError(f"{target!r}: expected MODULE:ATTR")
    module = import_module(target, module_name)
    if not attr:
        return module, None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{target}: {module_name} has no {attr!r}") from None
    return module, obj


def load_target(spec: str, *, method: str) -> Any:
    """The object `spec` names; called first when it is a factory lacking `method`."""
    _, obj = resolve(spec)
    if not hasattr(obj, method) and callable(obj):
        obj = obj()
    if not callable(getattr(obj, method, None)):
        raise TargetError(f"{spec!r}: the object has no {method}() method")
    return obj
