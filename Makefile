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

# fairseq declares torchaudio, which text never uses and which would pull in
# another multi-GB torch: fairseq goes in last and --no-deps. pip would then
# report the missing torchaudio as an "ERROR: pip's dependency resolver ..."
# whenever a later install touches a package fairseq depends on, which a
# newcomer reads as a failed install. So the installs that resolve skip that
# report (--no-warn-conflicts) and `pip check` runs once at the end instead:
# any other conflict is printed as pip words it, the known torchaudio one is
# replaced by one line saying why it is harmless.
TORCHAUDIO_NOTE := == note: pip check names torchaudio (declared by fairseq) as missing: left out on purpose, text never imports it (docs/installation.md)

$(VENV)/.deps: requirements.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "== installing torch ($(TORCH_SPEC)), requirements, then fairseq ($(FAIRSEQ_SPEC), --no-deps) into $(VENV)"
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install --no-warn-conflicts "$(TORCH_SPEC)"
	$(PIP) install --no-warn-conflicts -r requirements.txt setuptools wheel
	$(PIP) install --no-deps "$(FAIRSEQ_SPEC)"
	@check=$$($(PY) -m pip check 2>&1); \
	printf '%s\n' "$$check" | grep -v -e 'requires torchaudio' -e '^No broken requirements' -e '^$$' || true; \
	case "$$check" in *'requires torchaudio'*) echo "$(TORCHAUDIO_NOTE)";; esac
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
