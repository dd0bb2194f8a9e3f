# gpukit — every target bootstraps what it needs (venv, Python and Debian packages) first.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV    ?= .venv
PY      := $(VENV)/bin/python
GLUE    := $(VENV)/bin/glue
# Unset: `glue up` keeps the cluster's last VM count and backend (a fresh cluster: 2, local).
VMS     ?=
BACKEND ?=
SCHEDULER ?=
# Your machines (the ssh backend's hosts file; the terraform backend's root module) and your own S3 bucket:
# passed to `glue up` when set, kept in the cluster config like the rest.
HOSTS ?=
MODULE ?=
BUCKET_ENDPOINT ?=
BUCKET ?=
BUCKET_REGION ?=
BUCKET_PROFILE ?=
PYTEST_ARGS ?=
# Test workers (pytest-xdist). By default five lanes (tests/lanes.py), one worker each, each lane's files in
# order: the timing-sensitive local-VM tests (stall detection, multinode, the watcher's budgets) in the serial
# lane at normal priority, every other lane reniced so it cannot starve them on a 2-core machine.
# TEST_WORKERS=N (N > 1) spreads whole files over N workers; TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= lanes
XDIST = $(if $(filter lanes,$(TEST_WORKERS)),-n 5 --lanes,$(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile))

.PHONY: help bootstrap bootstrap-core up down demo test test-all lint docs bench clean

help: ## Show the targets
	@echo "gpukit — keep GPU training jobs running on rented GPU VMs"
	@echo
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-10s %s\n", $$1, $$2}'
	@echo
	@echo "  variables: VMS=N BACKEND=local|qemu|lyceum SCHEDULER=slurm|none (make up; unset: as last time, else 2, local, none)"

bootstrap: ## Install what every target needs (venv, torch, rclone, the dev tools; Debian: openssh-server, fuse3, sudo, shellcheck, chromium, mmdebstrap, systemd-container, qemu, socat); quick when done
	@./scripts/bootstrap.sh all

# What demo, up and down need (no dev tools, no test-only Debian packages): a fresh clone's demo starts sooner.
# For a backend whose VMs are elsewhere (BACKEND, else the kit home's last: lyceum, ssh) no Debian package
# but the ssh client, so no root.
bootstrap-core:
	@BACKEND=$(BACKEND) ./scripts/bootstrap.sh core

up: bootstrap-core ## Create the cluster (VMS=N, BACKEND=local|qemu|lyceum|ssh|terraform, SCHEDULER=slurm|none, HOSTS=FILE, MODULE=DIR, BUCKET_ENDPOINT= BUCKET= [BUCKET_REGION= BUCKET_PROFILE=]; unset: as last time) and configure it
	@$(GLUE) up $(if $(VMS),--vms $(VMS)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(SCHEDULER),--scheduler $(SCHEDULER)) \
		$(if $(HOSTS),--hosts $(HOSTS)) $(if $(MODULE),--module $(MODULE)) \
		$(if $(BUCKET_ENDPOINT),--bucket-endpoint $(BUCKET_ENDPOINT)) $(if $(BUCKET),--bucket $(BUCKET)) \
		$(if $(BUCKET_REGION),--bucket-region $(BUCKET_REGION)) $(if $(BUCKET_PROFILE),--bucket-profile $(BUCKET_PROFILE))

down: bootstrap-core ## Destroy the cluster's VMs (the bucket and its data are kept; FORCE=1: past the run checks)
	@$(GLUE) down $(if $(FORCE),--force)

demo: ## The whole loop on the local backend: up, train, lose a VM, recover, verify, down
	@BACKEND=local ./scripts/bootstrap.sh core
	@$(PY) -m glue.operations.recovery.demo

test: bootstrap ## Run the test suite (unit, integration on local VMs, e2e); five lanes; TEST_WORKERS=0 serially, =N files on N workers
	@$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-all: bootstrap ## The suite including the long `stress` tests (kill -9 storms, the lyceum demo, a seeded qemu VM)
	@$(PY) -m pytest $(XDIST) -m "" $(PYTEST_ARGS)

lint: bootstrap ## ruff, mypy, import layers, bucket keys (glue/train/layout.py only), record keys, code shape (no cycle, files <= 400 lines, functions <= 60 lines and 8 parameters), the VM side on Python 3.10 and 3.12, terraform fmt, ansible-lint, yamllint, the docs site (mkdocs build --strict)
	@$(VENV)/bin/ruff check glue tests bench scripts
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports --no-cache
	@$(PY) -m tests.lint_bucket_keys
	@$(PY) -m tests.lint_record_keys
	@$(PY) -m tests.lint_vm_python
	@$(PY) -m pytest -q -n 0 -p no:cacheprovider --no-header tests/unit/test_code_shape.py
	@TF_CLI_CONFIG_FILE=/dev/null terraform fmt -check -recursive terraform
	@shellcheck $$(grep -lE '^#!/bin/(ba)?sh' ansible/roles/*/files/*)
	@if [ -d ansible/roles ] && [ -n "$$(ls -A ansible/roles)" ]; then \
	  $(VENV)/bin/yamllint -s ansible && (cd ansible && ../$(VENV)/bin/ansible-lint --profile production -q); fi
	@# not -q: mkdocs counts --strict's warnings only when it logs them
	@d=$$(mktemp -d); out=$$(NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d $$d 2>&1); rc=$$?; rm -rf $$d; \
	  [ $$rc -eq 0 ] || { grep -v '^INFO' <<<"$$out" >&2; echo "make lint: the docs site does not build (mkdocs build --strict)" >&2; exit $$rc; }

docs: bootstrap ## Build the documentation site into site/ (its reference pages generated from the code)
	@out=$$(NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict 2>&1) || { grep -v '^INFO' <<<"$$out" >&2; exit 1; }
	@echo "docs: site/index.html (or: $(VENV)/bin/mkdocs serve)"

bench: bootstrap ## Benchmarks (each prints a ratio against a baseline measured in the same run)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean: ## Remove the venv and caches (NOT .gpukit/: the bucket's data lives there)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
