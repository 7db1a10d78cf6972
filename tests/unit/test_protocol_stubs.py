"""The committed type stubs of the protocol's generated modules (`protocol/_stubs/*.pyi`)
are the ones scripts/protocol_stubs.py makes from the descriptors installed now: a new
rocketmq-python-client that changed the protocol fails here until the script is run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "protocol_stubs_script", ROOT / "scripts" / "protocol_stubs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_stubs_match_the_installed_descriptors(tmp_path: Path) -> None:
    script = _script()
    made = script.generate(tmp_path)
    differences = script._differences(made, tmp_path)
    assert differences == [], "run scripts/protocol_stubs.py:\n" + "\n".join(differences[:40])


def test_every_runtime_module_has_its_stub() -> None:
    """What `protocol.pb` loads and `protocol.ext` builds is what the stubs declare."""
    from protocol import ext, pb

    stubs = ROOT / "protocol" / "_stubs"
    for name in pb.__all__:
        assert (stubs / f"{name}.pyi").exists(), name
    stub = (stubs / "batch_messaging_pb2.pyi").read_text()
    assert f"class {ext.ReceiveMessagesResponse.__name__}(" in stub
