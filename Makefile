# Phalanx: the two commands are `make run` and `make test`; everything they need is
# installed on first use into ~/.cache/phalanx (Python venv, Go builds), never into the repo.

SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/phalanx
VENV ?= $(CACHE)/venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)
DEPS_HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
STAMP := $(VENV)/.deps-$(DEPS_HASH)

.PHONY: deps run test unit lint e2e cluster-up cluster-down bench-quick bench clean-cache

$(STAMP): pyproject.toml
	@echo "installing Python dependencies into $(VENV) (first time only)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' > $(VENV)/requirements.txt
	@$(PY) -m pip install -q -r $(VENV)/requirements.txt
	@# `kubectl phalanx`: the [project.scripts] entry point, run from this tree (no build in the repo).
	@printf '#!/bin/sh\nPYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" exec "$(PY)" -m extender.kubectl "$$@"\n' > $(VENV)/bin/kubectl-phalanx
	@chmod +x $(VENV)/bin/kubectl-phalanx
	@touch $@

deps: $(STAMP)
	@$(PY) -m rpc.build

## run: the main job on the local embedded cluster
run: deps
	@$(PY) -m deploy.local run

## test: the whole suite (lint, unit, e2e on a real local control plane)
test: deps lint unit e2e

lint: deps
	@$(VENV)/bin/ruff check solver extender deploy benchmarks tests agent rpc solverd
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports

unit: deps
	@$(PY) -m pytest -q -m "not e2e" tests

e2e: deps
	@$(PY) -m deploy.local build
	@$(PY) -m pytest -q -m e2e tests/e2e

cluster-up: deps
	@$(PY) -m deploy.local up

cluster-down: deps
	@$(PY) -m deploy.local down

bench-quick: deps
	@$(PY) -m benchmarks.solver_scale --quick

bench: deps
	@$(PY) -m benchmarks.solver_scale
