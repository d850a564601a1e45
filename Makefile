# make setup | make run [PARAMS=params/X.yaml] | make lab | make test
# `run` and `lab` install the notebooks extra only; `test` adds the test extra (pytest, torch, ...).
PY ?= python3
VENV ?= .venv
PARAMS ?= params/smoke-cpu.yaml
comma := ,
UNAME := $(shell uname -s)
ifeq ($(UNAME),Darwin)
  MLX_EXTRA ?=
else ifneq ($(shell command -v nvidia-smi 2>/dev/null),)
  MLX_EXTRA ?= cuda13,
else
  MLX_EXTRA ?= cpu,
endif
RUN_EXTRAS := $(MLX_EXTRA)notebooks
TEST_EXTRAS := $(MLX_EXTRA)notebooks,test

.PHONY: setup setup-test test run lab clean
setup: $(VENV)/.installed-$(subst $(comma),-,$(RUN_EXTRAS))
setup-test: $(VENV)/.installed-$(subst $(comma),-,$(TEST_EXTRAS))

# One stamp per set of extras; the test set includes the run set, so after `make test` `make run` is a no-op.
$(VENV)/.installed-%: pyproject.toml
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e ".[$(subst -,$(comma),$*)]"
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $@
	@if [ "$*" = "$(subst $(comma),-,$(TEST_EXTRAS))" ]; then touch $(VENV)/.installed-$(subst $(comma),-,$(RUN_EXTRAS)); fi

test: setup-test
	$(VENV)/bin/python -m pytest -q

run: setup
	$(VENV)/bin/python -m pdlib notebooks --params $(PARAMS)

# JupyterLab refuses to start as root unless told (containers often run as root)
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=. $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/01_run_trials.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
