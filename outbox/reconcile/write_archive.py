"""`python -m outbox.reconcile.write_archive`: write the class-data-sharing archive that a
small reconciliation's JVM maps at its start (`classcache`), now, rather than at the exit
of the first small run, which takes 15-20 s longer for it (minutes on a loaded machine).
For an image build, or before a test suite whose first runs would otherwise each pay it.

It runs `reliable reconcile` on an empty SQLite outbox in a temporary directory: every
small run of this installation, whichever database it reads, has the same classpath and
JVM options (`job.session_jars`), so the same archive."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from sqlalchemy import create_engine

from outbox.models import OutboxTables
from outbox.reconcile.classcache import archive_path, is_archive
from outbox.reconcile.job import SMALL_INPUT_JAVA_OPTIONS, session_jars
from outbox.reconcile.preflight import find_java


def main(argv: list[str] | None = None) -> int:
    """Write the archive a small run maps, now."""
    parser = argparse.ArgumentParser(
        prog="python -m outbox.reconcile.write_archive",
        description="Write the class archive that a small reconciliation's JVM maps at its "
        "start, now, instead of at the exit of the first small run (which then takes "
        "15-20 s longer): for an image build, or before a test suite. Exit 0: the archive "
        "is there (or archives are off); 1: it could not be written.",
    )
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        path = archive_path(find_java(), session_jars("sqlite"), SMALL_INPUT_JAVA_OPTIONS)
    except Exception as exc:  # no Java, no SQLite JDBC driver: said, not raised
        path, state = None, f"unavailable: {exc}"
    else:
        state = "off" if path is None else "present" if is_archive(path) else "missing"
    if state == "missing" and path is not None:
        print(
            f"writing the class archive {path} (a small run on an empty outbox) ...",
            file=sys.stderr,
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="reliable-cds-") as work:
            db = f"sqlite:///{work}/outbox.db"
            engine = create_engine(db)
            OutboxTables().create_all(engine)
            engine.dispose()
            done = subprocess.run(
                [sys.executable, "-m", "reliable_cli", "reconcile", "--db", db],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
        state = "written" if is_archive(path) else "not written"
        if state == "not written":
            print(done.stderr[-2000:], file=sys.stderr)
    seconds = round(time.monotonic() - started, 1)
    if args.json:
        print(
            json.dumps({"state": state, "archive": str(path) if path else None, "seconds": seconds})
        )
    else:
        print(f"class archive: {state}" + (f" ({path}, {seconds} s)" if path else ""))
    return 1 if state == "not written" or state.startswith("unavailable") else 0


if __name__ == "__main__":
    raise SystemExit(main())
