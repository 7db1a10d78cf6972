"""Benchmark runner: `python -m bench <suite>|all [--quick] [--json]`.

Suites are the modules of this package without a leading underscore (each defines `run`);
each prints a table (stdout) and progress (stderr). With `--json` the last line of stdout
is one JSON object: the suite's metrics for one suite, `{suite: metrics, ...}` for `all`;
a figure that could not be measured is null. A case that failed is listed under `errors`
(in the JSON, and on stderr) and the run exits 1; a peer that could not be measured is not
a failure of the run (its rows and `<peer>_error` say why).
Figures are never asserted by tests; they are compared with the floor measured in the
same run on the same machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import bench
from bench._common import Options, SuiteResult, format_table, progress


def discover() -> list[str]:
    """Suite names: the package's modules without a leading underscore (not imported yet,
    so one suite's heavy or missing dependency never stops another from running)."""
    return sorted(
        info.name for info in pkgutil.iter_modules(bench.__path__) if not info.name.startswith("_")
    )


def load(name: str) -> ModuleType:
    module = importlib.import_module(f"bench.{name}")
    if not callable(getattr(module, "run", None)):
        raise SystemExit(f"bench.{name} defines no run(opts): not a suite")
    return module


def main(argv: list[str] | None = None) -> int:
    suites = discover()
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Run benchmark suites and print their figures."
    )
    parser.add_argument("suite", choices=[*suites, "all"], help="suite to run, or all")
    parser.add_argument(
        "--quick", action="store_true", help="short runs (under a minute per suite)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the metrics as one JSON object on the last line"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="directory for the suites' files (default: a temp dir)",
    )
    parser.add_argument(
        "--only",
        metavar="REGEX",
        default=None,
        help="run only the cases whose name matches (grpc: a case's group, "
        "e.g. '^framework_send$' or 'official|stub_official')",
    )
    parser.add_argument(
        "--repeat",
        metavar="N",
        type=int,
        default=1,
        help="grpc, rocketmq: run every case N times, pass after pass, and report each "
        "figure's median (a pass disturbed by the machine moves no verdict)",
    )
    parser.add_argument(
        "--stub-work-us",
        metavar="N",
        type=float,
        default=0.0,
        help="grpc: the no-work stub spends N microseconds of CPU on each send and ack, "
        "to see how far a client's cap falls with a server's work per call",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat: must be at least 1")
    if args.stub_work_us < 0:
        parser.error("--stub-work-us: must be at least 0")
    if args.only is not None:
        try:
            re.compile(args.only)
        except re.error as exc:
            parser.error(f"--only: {exc}")
    names = list(suites) if args.suite == "all" else [args.suite]
    modules = {name: load(name) for name in names}
    results: dict[str, SuiteResult] = {}
    with tempfile.TemporaryDirectory(prefix="reliable-bench-", dir=args.dir) as tmp:
        for name in names:
            workdir = Path(tmp) / name
            workdir.mkdir()
            progress(f"suite {name}{' (quick)' if args.quick else ''} in {workdir}")
            results[name] = modules[name].run(
                Options(
                    quick=args.quick,
                    workdir=workdir,
                    only=args.only,
                    repeat=args.repeat,
                    stub_work_us=args.stub_work_us,
                )
            )
            description = getattr(modules[name], "DESCRIPTION", "")
            print(format_table(f"== {name}: {description}", results[name]))
            print()
    errors = [f"{n}: {e}" for n, r in results.items() for e in r.errors]
    for error in errors:
        progress(f"FAILED {error}")
    if args.json:
        if args.suite == "all":
            payload: dict[str, object] = {n: r.metrics for n, r in results.items()}
        else:
            payload = dict(results[names[0]].metrics)
        if errors:
            payload["errors"] = errors
        sys.stdout.flush()
        print(json.dumps(payload, sort_keys=True))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
