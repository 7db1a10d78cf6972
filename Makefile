# The two set-up commands are `make demo` and `make test`; both work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test lint bench soak system packages services clean help rocketmq

help:
	@echo "make demo   - run the end-to-end demo on embedded defaults"
	@echo "make test   - install everything needed and run the test suite"
	@echo "make lint   - ruff, mypy (strict) and the layering contract (lint-imports)"
	@echo "make bench  - run the benchmarks and print a table"
	@echo "make rocketmq - run Apache RocketMQ 5 (name server, broker, proxy) here until Ctrl-C"

# the system packages first: the install compiles broker/store/_recordpack.c against them
$(STAMP): pyproject.toml setup.py broker/store/_recordpack.c | packages
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

system:
	scripts/ensure-system.sh

packages:
	scripts/ensure-system.sh --no-services

services:
	scripts/ensure-system.sh --services-only

demo: $(STAMP) system
	$(VENV)/bin/reliable demo $(DEMO_ARGS)

# the reconciliation's class archive first (docs/reconcile.md): written once here, ~20 s,
# rather than by whichever of the suite's first Spark runs comes first, minutes under load
# and the gateway's program (docs/gateway.md), built once (about a minute) before the tests
# that start it race to build it on a loaded machine
test: $(STAMP) system
	$(PY) -m outbox.reconcile.write_archive || echo "make test: no class archive; small Spark runs start without one"
	$(PY) -m reliable_cli gateway build
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff format --check protocol broker reliable reliable_cli outbox idempotency bench tests examples scripts apache_rocketmq
	$(VENV)/bin/ruff check protocol broker reliable reliable_cli outbox idempotency bench tests examples scripts apache_rocketmq
	$(VENV)/bin/mypy protocol broker reliable outbox idempotency reliable_cli apache_rocketmq
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) -m bench all

# Apache RocketMQ 5 from Maven Central's jars (docs/rocketmq.md); prints its gRPC endpoint
rocketmq: $(STAMP) packages
	$(PY) -m apache_rocketmq run $(ROCKETMQ_ARGS)

soak: $(STAMP) system
	$(PY) -m pytest tests/chaos tests/fuzz -m "chaos or fuzz" --soak --timeout=3600 -s -n0 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -f broker/store/_recordpack.*.so
