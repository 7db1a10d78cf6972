"""The layering contract (pyproject.toml, [tool.importlinter]) holds on the tree, and bites.

reliable_cli > idempotency > outbox > reliable > broker > protocol: a package imports only
from the layers below it (protocol, what both ends of the wire share, imports none of the
others); the remote client (the grpc transport, the admin client, the consumers) imports
nothing of the broker's server, store or `Broker`, directly or through another module; and
the modules of each package import each other without cycles. `make lint` runs the same
check (`lint-imports`); this test runs it in the suite too, and proves that it fails on a
deliberately wrong import, in a copy of the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import importlinter  # noqa: F401  a dev dependency: missing, the suite fails here
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "broker", "reliable", "outbox", "idempotency", "reliable_cli")
LINT = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy_of_the_tree(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(
            ROOT / name,
            tmp_path / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_the_layers_and_has_no_cycles() -> None:
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        # the client core reaching up for the concrete idempotency guard
        (
            "reliable/_wrong.py",
            "import idempotency\n",
            "reliable is not allowed to import idempotency",
        ),
        # the broker importing the client
        (
            "broker/_wrong.py",
            "from reliable.errors import ReliableError\n",
            "broker is not allowed to import reliable",
        ),
        # the outbox importing the command line's exit codes (the cycle that used to be)
        (
            "outbox/_wrong.py",
            "from reliable_cli.exit_codes import ExitCode\n",
            "outbox is not allowed to import reliable_cli",
        ),
        # two client modules importing each other
        ("reliable/_wrong.py", "import reliable.producer\n", "No cycles are allowed in reliable"),
        # the protocol layer importing the broker
        ("protocol/_wrong.py", "import broker.names\n", "protocol is not allowed to import broker"),
        # the grpc transport reaching into the server for what the protocol layer has
        (
            "reliable/transport/_grpc_session.py",
            "from broker.server.auth import verify  # noqa\n",
            "reliable.transport._grpc_session is not allowed to import broker.server",
        ),
        # a consumer reaching for the store through a broker module that imports it
        (
            "reliable/consumer/_wrong.py",
            "from broker.parking import ParkedGroups\n",
            "reliable.consumer is not allowed to import broker.store",
        ),
        # the admin client importing the Broker
        (
            "reliable/admin.py",
            "from broker.broker import Broker  # noqa\n",
            "reliable.admin is not allowed to import broker.broker",
        ),
    ],
)
def test_a_wrong_import_breaks_the_contract(
    tmp_path: Path, module: str, source: str, broken: str
) -> None:
    tree = _copy_of_the_tree(tmp_path)
    if "cycles" in broken:  # make the producer import the new module back
        producer = tree / "reliable" / "producer.py"
        producer.write_text(producer.read_text() + "\nfrom reliable import _wrong  # noqa\n")
    target = tree / module  # a new module, or an import added to an existing one
    target.write_text((target.read_text() + "\n" if target.exists() else "") + source)
    proc = _lint(tree)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert broken in proc.stdout, proc.stdout


def _modules_loaded_by(*imports: str) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for name in {list(imports)!r}: importlib.import_module(name)\n"
        "print('\\n'.join(sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_a_remote_client_process_never_loads_the_brokers_server_store_or_broker() -> None:
    loaded = _modules_loaded_by(
        "reliable", "reliable.transport.grpc", "reliable.admin", "reliable.consumer.orderly"
    )
    assert "reliable.transport.grpc" in loaded
    inside = sorted(
        m for m in loaded if m.startswith(("broker.server", "broker.store", "broker.broker"))
    )
    assert inside == [], inside


def test_the_protocol_layer_loads_nothing_else_of_the_project() -> None:
    modules = sorted(p.stem for p in (ROOT / "protocol").glob("*.py") if p.stem != "__init__")
    loaded = _modules_loaded_by(*(f"protocol.{m}" for m in modules))
    assert {f"protocol.{m}" for m in modules} <= loaded
    others = sorted(
        m for m in loaded if m.split(".")[0] in PACKAGES and m.split(".")[0] != "protocol"
    )
    assert others == [], others
