#!/usr/bin/env bash
# Apache RocketMQ 5 on this machine: a name server and a proxy with its broker embedded,
# from Maven Central's jars (downloaded once into ~/.cache/reliable/rocketmq/<version>).
# Usage: scripts/rocketmq-cluster.sh start|stop|status|run|topic NAME|group NAME [--help]
# `start` prints the gRPC endpoint; see docs/rocketmq.md.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "rocketmq: no .venv here; run make test (or make demo) once first" >&2; exit 1; }
exec "$py" -m apache_rocketmq "$@"
