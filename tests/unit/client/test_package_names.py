"""The package's public names, imported on first use (reliable/__init__.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import reliable


def test_every_public_name_is_mapped_and_resolves_to_its_module() -> None:
    assert set(reliable._WHERE) == set(reliable.__all__)
    for name in reliable.__all__:
        assert getattr(reliable, name) is getattr(sys.modules[reliable._WHERE[name]], name)


def test_an_unknown_name_is_an_attribute_error_and_a_submodule_is_imported() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        reliable.Nope  # noqa: B018
    assert reliable.transport.__name__ == "reliable.transport"  # type: ignore[attr-defined]


def test_importing_the_errors_does_not_import_the_client() -> None:
    code = "import sys, reliable.errors; print('reliable.producer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
