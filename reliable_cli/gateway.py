"""`reliable gateway start|build`: the RocketMQ 5 gRPC front end of a broker (docs/gateway.md).

`start` runs the gateway (broker/gateway, in Go) in this process's place: it serves gRPC on
`--listen` and passes the calls to `--broker` over the broker's native wire. It is built
on first use (`build` does only that, and prints the program's path). Exit codes: 0 ok
(stopped by SIGTERM/SIGINT); 1 the gateway could not be built; 2 usage, or the broker
named no wire port; what the gateway itself exits with otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from reliable_cli import Subparsers


def register(subparsers: Subparsers) -> None:
    gateway = subparsers.add_parser(
        "gateway",
        help="the RocketMQ 5 gRPC front end of a broker (for the official clients)",
        description="A gRPC front end in Go for `reliable broker start`: the official "
        "RocketMQ clients connect to it, and it passes their calls to the broker over the "
        "broker's native wire (docs/gateway.md).",
    )
    verbs = gateway.add_subparsers(dest="verb", metavar="<verb>")
    start = verbs.add_parser(
        "start",
        help="serve gRPC in front of a broker",
        description="Serve the RocketMQ 5 gRPC protocol on --listen, passing every call to "
        "the broker at --broker (its gRPC endpoint) over its native wire. Prints "
        "'reliable gateway: serving on HOST:PORT ...' once ready. SIGTERM/SIGINT stop it "
        "(running calls get 5 s).",
    )
    start.add_argument(
        "--broker", required=True, metavar="HOST:PORT", help="the broker's gRPC endpoint"
    )
    start.add_argument(
        "--listen",
        default="127.0.0.1:8081",
        metavar="HOST:PORT",
        help="where to serve gRPC (port 0: any free port; default %(default)s)",
    )
    start.add_argument(
        "--wire",
        metavar="HOST:PORT",
        help="the broker's native wire (default: asked from the broker; name it when the "
        "broker requires signatures)",
    )
    start.add_argument(
        "--linger",
        metavar="DURATION",
        help="how long a send or an ack waits for others of its client to share its "
        "request to the broker, e.g. 2ms (default 0: only those queued while a write goes "
        "out share it)",
    )
    start.add_argument(
        "--procs",
        type=int,
        metavar="N",
        help="cores the gateway runs on at once (GOMAXPROCS; default: all). 1 suits a "
        "small machine it shares with the broker and the clients: less CPU a call",
    )
    start.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate (PEM)")
    start.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    start.add_argument(
        "--broker-ca", metavar="FILE", help="reach a TLS broker, trusting this CA (PEM)"
    )
    start.add_argument(
        "--broker-server-name",
        metavar="NAME",
        help="the name the broker's certificate is for (default: --broker's host)",
    )
    start.set_defaults(handler=_start)
    build = verbs.add_parser(
        "build",
        help="build the gateway now and print its path",
        description="Build the gateway from its Go sources (once; the Go module proxy "
        "provides grpc-go) and print the program's path.",
    )
    build.set_defaults(handler=_build)
    gateway.set_defaults(handler=lambda _args: _usage(gateway))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return ExitCode.USAGE


def _program() -> str | None:
    from broker.gateway import GatewayUnavailable, binary

    try:
        return str(binary())
    except GatewayUnavailable as exc:
        print(f"reliable gateway: {exc}", file=sys.stderr)
        return None


def _build(_args: argparse.Namespace) -> int:
    program = _program()
    if program is None:
        return ExitCode.FAILURE
    print(program)
    return ExitCode.OK


# Go's runtime monitor (sysmon) sleeps deeply whenever every P is idle, and the next system
# call (a socket read) wakes it with a futex; woken so, it polls every 20 us for a
# millisecond or more before it sleeps again. A gateway answering calls one at a time is
# idle between every two, so each call paid those wake-ups: 7 context switches a call, 4 of
# them the monitor's, and 40% of the gateway's CPU in the kernel's task switch (perf). A
# scheduler trace interval keeps the monitor out of that deep sleep (the runtime's own
# rule: it must wake to print the trace), so it backs off to a poll every 10 ms instead of
# being woken by each call. Its interval is the longest there is (2^31-1 ms, 24.8 days): the
# trace's line is printed only that long after the machine booted, once at start on a
# machine up longer. A GODEBUG of the caller's own comes after it and wins.
QUIET_MONITOR = "schedtrace=2147483647"


def go_runtime_env(environ: Mapping[str, str], procs: int | None) -> dict[str, str]:
    """The gateway's environment: `environ`, with GOMAXPROCS from `procs` (None: Go's
    default, every core) and the monitor kept from being woken by every call
    (`QUIET_MONITOR`) unless the caller's GODEBUG sets schedtrace itself."""
    env = dict(environ)
    if procs is not None:
        env["GOMAXPROCS"] = str(procs)
    godebug = env.get("GODEBUG", "")
    env["GODEBUG"] = f"{QUIET_MONITOR},{godebug}" if godebug else QUIET_MONITOR
    return env


def _start(args: argparse.Namespace) -> int:
    program = _program()
    if program is None:
        return ExitCode.FAILURE
    argv = [program, "--broker", args.broker, "--listen", args.listen]
    for option in ("wire", "linger", "tls_cert", "tls_key", "broker_ca", "broker_server_name"):
        value = getattr(args, option)
        if value:
            argv += [f"--{option.replace('_', '-')}", value]
    if args.procs is not None and args.procs < 1:
        print("reliable gateway: --procs must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    env = go_runtime_env(os.environ, args.procs)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, argv, env)  # the gateway takes this process's place: its pid, its signals
