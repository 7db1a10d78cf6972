"""Build step for the one compiled module, broker/store/_recordpack.c (everything else is in
pyproject.toml).

The module packs batches of commitlog records; the store works without it (batch.py has the
same encoder in Python) but puts batches several times slower. So it is optional: without a
C compiler the install goes on and the store uses the Python path. Its body CRC comes from
libdeflate when the headers are there (Debian `libdeflate-dev`, which `make` installs) and
from zlib otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

INCLUDE_DIRS = [Path("/usr/include"), Path("/usr/local/include")]


def _has_header(name: str) -> bool:
    extra = os.environ.get("CPATH", "").split(os.pathsep)
    return any((Path(d) / name).is_file() for d in [*INCLUDE_DIRS, *filter(None, extra)])


def _recordpack() -> Extension:
    if _has_header("libdeflate.h"):
        macros, libraries = [("HAVE_LIBDEFLATE", "1")], ["deflate"]
    else:
        macros, libraries = [], ["z"]
    return Extension("broker.store._recordpack", ["broker/store/_recordpack.c"],
                     define_macros=macros, libraries=libraries,
                     extra_compile_args=["-O2"], optional=True)


setup(ext_modules=[_recordpack()])
