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
SOURCES := setup.py $(shell find fairseq_natbias -name '*.py' 2>/dev/null)
PYTEST_ARGS ?=
# The tests mostly wait on single-threaded fairseq subprocesses: one pytest
# worker per core, whole modules per worker (module fixtures built once).
TEST_WORKERS ?= 2

.PHONY: install test demo clean-venv

install: $(VENV)/.installed

$(VENV)/.deps: requirements.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "== installing torch ($(TORCH_SPEC)), fairseq ($(FAIRSEQ_SPEC), --no-deps) and requirements into $(VENV)"
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install --no-deps "$(FAIRSEQ_SPEC)"
	$(PIP) install -r requirements.txt setuptools wheel
	@touch $@

# A regular (not editable) install: fairseq resolves `--user-dir
# fairseq_natbias` next to its own package too, so it works from any directory.
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install --no-deps --no-build-isolation --force-reinstall .
	@rm -rf build *.egg-info
	@touch $@

test: install
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

demo: install
	$(PY) -m fairseq_natbias.cli.demo $(DEMO_ARGS)

clean-venv:
	rm -rf $(VENV)
