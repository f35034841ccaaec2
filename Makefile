# Two commands matter: `make run` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TOOLS  := .tools
BUF_VERSION := 1.75.0
BUF    := $(TOOLS)/node_modules/.bin/buf
LISTEN ?= 127.0.0.1:7700
# The HTTP/JSON door of `make run` and `make server` (docs/http.md); HTTP=off turns it off.
HTTP   ?= 127.0.0.1:7780
DATA   ?= .electric
TS     := clients/typescript
DASHBOARD_PORT ?= 8866

.PHONY: dist run server cluster dashboard test lint openapi proto proto-check buf-lint buf-breaking pytest ts-gen ts-test ts-pack bench typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@# The notebooks' kernel: this virtualenv's Python, as the kernel spec "electric" inside it.
	$(PY) -m ipykernel install --prefix $(VENV) --name electric --display-name "Python (electric)" >/dev/null
	touch $@

venv: $(STAMP)

$(BUF):
	@if command -v npm >/dev/null 2>&1; then \
	  mkdir -p $(TOOLS) && npm install --silent --prefix $(TOOLS) --no-save --no-audit --no-fund @bufbuild/buf@$(BUF_VERSION); \
	else echo "buf: skipped, Node.js/npm not found (buf is installed from npm)"; fi

# The control plane and a worker hosting the example agents, in one process.
run: $(STAMP)
	$(VENV)/bin/electric dev examples.agents:app --exec examples/tasks.toml --listen $(LISTEN) --http $(HTTP) --data $(DATA)

# The control plane alone (workers connect with `electric worker MODULE:APP`).
server: $(STAMP)
	$(VENV)/bin/electric server --listen $(LISTEN) --http $(HTTP) --data $(DATA)

# Three replicas on one PostgreSQL database (ELECTRIC_DATABASE_URL, default the local "electric",
# created if absent) and a worker hosting the examples; Ctrl-C stops them all (scripts/cluster.py).
cluster: $(STAMP)
	$(PY) scripts/cluster.py

# The operator's console (notebooks/control_panel.ipynb) as a web app (Voilà), on
# http://127.0.0.1:$(DASHBOARD_PORT)/: the server at ELECTRIC_ADDRESS, else `make run`'s (LISTEN).
dashboard: $(STAMP)
	ELECTRIC_ADDRESS="$${ELECTRIC_ADDRESS:-$(LISTEN)}" $(VENV)/bin/voila notebooks/control_panel.ipynb --no-browser --port=$(DASHBOARD_PORT) --Voila.ip=127.0.0.1

# The sdist and the wheel in dist/: one distribution, electric-sdk, whose extras choose what is
# installed ([server], [postgres], [notebook]; README.md, "Install").
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .

# The HTTP door's OpenAPI document, docs/openapi.json, from its route table (drift-tested).
openapi: $(STAMP)
	$(PY) scripts/genopenapi.py

proto: $(STAMP)
	$(PY) scripts/genproto.py

proto-check: $(STAMP)
	$(PY) scripts/genproto.py --check

buf-lint: $(BUF)
	@if [ -x $(BUF) ]; then $(BUF) lint && echo "buf lint: clean"; \
	else echo "buf lint: skipped, Node.js/npm not found"; fi

# Compares proto/ with main's once main has protos; skipped before that.
buf-breaking: $(BUF)
	@if [ ! -x $(BUF) ]; then echo "buf breaking: skipped, Node.js/npm not found"; \
	elif ! git rev-parse --verify --quiet main >/dev/null || \
	     [ -z "$$(git ls-tree -r --name-only main -- proto 2>/dev/null)" ]; then \
	  echo "buf breaking: skipped, main has no protos yet"; \
	else $(BUF) breaking --against '.git#branch=main' && echo "buf breaking: compatible with main"; fi

typecheck: $(STAMP)
	$(VENV)/bin/mypy electric_sdk server/electric_server

lint: $(STAMP) buf-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy electric_sdk server/electric_server

# Then the HTTP, PostgreSQL, store and accept tests once more with every fast path forced off
# (ELECTRIC_FORCE_FALLBACKS=all; server/electric_server/fastpaths/), so the code that runs without
# each speed trick, or on a dependency without the internals one reaches into, is tested too.
# About 2.5 minutes more on 2 cores, most of it waiting on servers and databases.
FALLBACK_TESTS := tests/test_store*.py tests/test_pg_*.py tests/test_postgres_faults.py \
	tests/test_http*.py tests/test_openapi.py tests/test_schemathesis.py \
	tests/test_accept.py tests/test_internals.py tests/test_fastpaths.py

# The suite runs on PYTEST_WORKERS processes (pytest-xdist), a file per process at a time so a
# module's shared server stays in one: on 2 cores two processes take about 0.55x one's time,
# since most tests wait on servers, workers and fsyncs. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2

pytest: $(STAMP)
	$(VENV)/bin/pytest --numprocesses=$(PYTEST_WORKERS) --dist=loadfile
	ELECTRIC_FORCE_FALLBACKS=all $(VENV)/bin/pytest -q -p no:cacheprovider --numprocesses=$(PYTEST_WORKERS) --dist=loadfile $(FALLBACK_TESTS)

# The TypeScript client (clients/typescript): regenerate src/gen with buf and
# protoc-gen-es (pinned in its package.json), or check it for drift and run
# its Node test against a live server. Both need Node.js/npm.
ts-gen: $(BUF)
	npm ci --prefix $(TS) --loglevel=error --no-audit --no-fund
	$(BUF) generate --template buf.gen.yaml

ts-test: $(STAMP) $(BUF)
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix $(TS) --loglevel=error --no-audit --no-fund && \
	  BUF=$(abspath $(BUF)) sh $(TS)/scripts/check-gen.sh && \
	  ELECTRIC_PYTHON=$(abspath $(PY)) npm test --prefix $(TS) --silent; \
	else echo "typescript client test: skipped, Node.js/npm not found"; fi

# The TypeScript client as a tarball, dist/electric-client-VERSION.tgz, built here (its prepack):
# `npm install path/to/electric-client-VERSION.tgz` in any Node project builds nothing there.
ts-pack:
	npm ci --prefix $(TS) --loglevel=error --no-audit --no-fund
	mkdir -p dist
	npm pack ./$(TS) --pack-destination dist --loglevel=error

test: lint buf-breaking proto-check pytest ts-test

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/run_all.py

clean:
	rm -rf dist $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache $(TS)/node_modules $(TS)/dist
