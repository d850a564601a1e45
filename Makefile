# make setup | make test | make run [PARAMS=params/X.yaml]
PY ?= python3
VENV ?= .venv
PARAMS ?= params/smoke-cpu.yaml
comma := ,
UNAME := $(shell uname -s)
ifeq ($(UNAME),Darwin)
  EXTRAS ?= dev
else ifneq ($(shell command -v nvidia-smi 2>/dev/null),)
  EXTRAS ?= cuda13,dev
else
  EXTRAS ?= cpu,dev
endif

.PHONY: setup test run clean
setup: $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

$(VENV)/.installed-%: pyproject.toml
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@rm -f $(VENV)/.installed-* && touch $@

test: setup
	$(VENV)/bin/python -m pytest -q

run: setup
	$(VENV)/bin/python -m pdlib notebooks --params $(PARAMS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
