# make setup | make run [PARAMS=params/X.yaml] | make lab | make test | make test-fast | make lint
# make gpu OUT=DIR   on a GPU machine with MLX installed (no venv): check-kernels, bench-step, the report
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

.PHONY: setup setup-test test test-fast lint run lab gpu gpu-partition gpu-rounds gpu-rounds-bench gpu-serve-step gpu-search gpu-search-pair gpu-cache-pack \
	gpu-cache-unpack device-parts clean
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

# the whole suite, lint first; test-fast leaves out what is marked slow (notebook runs, the flash emulation, ...)
LINT := $(VENV)/bin/python -m ruff check pdlib tests && $(VENV)/bin/python -m ruff format --check pdlib tests
test: setup-test
	$(LINT)
	$(VENV)/bin/python -m pytest -q

test-fast: setup-test
	$(VENV)/bin/python -m pytest -q -m "not slow"

lint: setup-test
	$(LINT)

run: setup
	$(VENV)/bin/python -m pdlib notebooks --params $(PARAMS)

# JupyterLab refuses to start as root unless told (containers often run as root)
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=. $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/01_run_trials.ipynb

# The GPU runbook: every kernel against its twin first (nothing else runs if a row fails), then bench-step with
# its peers, then the published experiment through the gate. The machine's own python3 with MLX (CUDA) and
# mlx-lm installed; TF32 off, as the reference needs. docs/gpu.md says how to install MLX offline.
GPU_PY ?= python3
# A GPU target's OUT: given, new or empty (results are never overwritten), then made.
define fresh_out
	@test -n "$(OUT)" || { echo "error: make $@ needs OUT=DIR (a new folder for the results)" >&2; exit 2; }
	@test ! -e "$(OUT)" || test -z "$$(ls -A "$(OUT)")" || { echo "error: $(OUT) holds files; results are never overwritten" >&2; exit 2; }
	mkdir -p "$(OUT)"
endef
GPU_PARAMS ?= params/qwen3-0.6b-4096x1024.yaml
# check-kernels' kernel families checked at once, each in its own process (docs/gpu.md)
CHECK_JOBS ?= 4
CHECK_KERNELS = MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib check-kernels --jobs $(CHECK_JOBS) --output "$(OUT)/check-kernels.json"
gpu:
	$(fresh_out)
	$(CHECK_KERNELS)
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib bench-step --output "$(OUT)/bench-step.json"
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib run --params $(GPU_PARAMS) --output "$(OUT)/report.json"

# The partition policy on one CUDA GPU: check-kernels (its slice rows included), the k curve, then eager,
# chunked, overlap and partition at 4,096/1,024/128 (5 trials, and the params file's two mlx-lm peers) and
# 16,384/256/512 (3 trials).
gpu-partition:
	$(fresh_out)
	$(CHECK_KERNELS)
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib partition-curve --output "$(OUT)/partition-curve.json"
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib run --params params/qwen3-0.6b-4096x1024.yaml \
		--policies eager chunked overlap partition --output "$(OUT)/report-4k.json"
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib run --params params/qwen3-0.6b-16384x256.yaml --output "$(OUT)/report-16k.json"

# A serving decode round of N requests: check-kernels, then rounds of 1, 8 and 32 decodes at 2,048 positions in
# every PDLIB_DECODE_ROUND mode (observed and pipelined, against the byte floor) and where a round's time goes,
# each again with a round's matmuls in 16-row tiles (PDLIB_ROUND_GEMM=tiles16). On a fresh machine the whole can
# outlast a ten-minute command: `gpu-rounds-bench` is the part after check-kernels, for a second command.
ROUND_BENCH = --contexts 2048 --tokens 100 --no-peers
ROUND_PROFILE = --rounds 8 32 --context 2048 --steps 20
define round_bench
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib bench-step $(ROUND_BENCH) --rounds 1 8 32 --output "$(OUT)/bench-rounds.json"
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib profile-step $(ROUND_PROFILE) --output "$(OUT)/profile-rounds.json"
	PDLIB_ROUND_GEMM=tiles16 MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib bench-step $(ROUND_BENCH) --rounds 8 32 \
		--output "$(OUT)/bench-rounds-tiles16.json"
	PDLIB_ROUND_GEMM=tiles16 MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib profile-step $(ROUND_PROFILE) \
		--output "$(OUT)/profile-rounds-tiles16.json"
endef
gpu-rounds:
	$(fresh_out)
	$(CHECK_KERNELS)
	$(round_bench)
gpu-rounds-bench:
	$(fresh_out)
	$(round_bench)

# Where a serving step with a prompt chunk spends its host time (chunked's and mixed's steps, 512 tokens beside 0, 8
# and 32 decode rows at 2,048 positions, both dispatch modes): the step, Engine.batch alone, and its Python profile.
gpu-serve-step:
	$(fresh_out)
	MLX_ENABLE_TF32=0 $(GPU_PY) -m pdlib profile-step --chunk 512 --rows 0 8 32 --context 2048 --steps 20 \
		--output "$(OUT)/profile-serve-step.json"

# Two searches at once on a host with two GPUs, one params file a GPU (by default the code trace on the first and
# the conversation trace on the second, so every comparison within a trace, policies and mlx-lm, stays on one
# GPU). Each process has its own PTX cache (neither reads a module the other is still writing) and its own log,
# which a later command resumes (SEARCH_LOGS, git-ignored; named after the params file); decode rounds run
# compiled, those of 3-8 rows as one persistent launch (the fastest measured, docs/engine.md): settings every
# log records, so a log made with others is refused naming the switch (set it as the log has it).
# SEARCH_ARGS narrows the runs (--policies ... --peers ...); SEARCH_BUDGET is --budget-s. What each prints goes to
# OUT/<params name>.txt, its report to OUT/<params name>.json.gz; exit 1 if either failed.
SEARCH_A ?= params/serve-azure-code-h200.yaml
SEARCH_B ?= params/serve-azure-conv-h200.yaml
SEARCH_BUDGET ?= 540
SEARCH_LOGS ?= outputs/local
SEARCH_ARGS ?=
SEARCH_ENV = MLX_ENABLE_TF32=0 PDLIB_KV_CACHE_GIB=$${PDLIB_KV_CACHE_GIB:-90} PDLIB_DECODE_ROUND=$${PDLIB_DECODE_ROUND:-compiled} \
	PDLIB_ROUND_PAIRS=$${PDLIB_ROUND_PAIRS:-8} PDLIB_ROUND_GROUP=$${PDLIB_ROUND_GROUP:-8}
# GPU i's PTX cache starts as a copy of what check-kernels compiled (MLX's default cache), where it has none yet
ptx_cache = test -d /tmp/mlx-ptx-gpu$(1) || ! ls -d /tmp/mlx/*/ptx >/dev/null 2>&1 || \
	cp -r "$$(ls -d /tmp/mlx/*/ptx | head -n 1)" /tmp/mlx-ptx-gpu$(1)
search_one = CUDA_VISIBLE_DEVICES=$(1) MLX_PTX_CACHE_DIR=/tmp/mlx-ptx-gpu$(1) $(SEARCH_ENV) $(GPU_PY) -m pdlib serve \
	--params $(2) --search --budget-s $(SEARCH_BUDGET) $(SEARCH_ARGS) --log "$(SEARCH_LOGS)/$(basename $(notdir $(2))).jsonl" \
	--output "$(OUT)/$(basename $(notdir $(2))).json.gz" > "$(OUT)/$(basename $(notdir $(2))).txt" 2>&1
gpu-search-pair:
	@test "$(notdir $(SEARCH_A))" != "$(notdir $(SEARCH_B))" || { echo "error: SEARCH_A and SEARCH_B share a name, so would their logs" >&2; exit 2; }
	$(fresh_out)
	mkdir -p "$(SEARCH_LOGS)"
	$(call ptx_cache,0); $(call ptx_cache,1)
	$(call search_one,0,$(SEARCH_A)) & a=$$!; $(call search_one,1,$(SEARCH_B)) & b=$$!; \
	wait $$a; ra=$$?; wait $$b; rb=$$?; tail -n 4 "$(OUT)"/*.txt; test $$ra = 0 && test $$rb = 0

# One search command on one GPU (SEARCH_A's params file), as gpu-search-pair's first half, after check-kernels
# where it has not passed on this machine yet; the log is copied into OUT (a machine lent for a while does not
# keep it: bring it back into SEARCH_LOGS to resume on another of the same kind).
gpu-search:
	$(fresh_out)
	mkdir -p "$(SEARCH_LOGS)"
	test -f /tmp/pdlib-check-kernels.passed || { $(CHECK_KERNELS) > "$(OUT)/check-kernels.txt" 2>&1 && \
		touch /tmp/pdlib-check-kernels.passed; } || { tail -n 20 "$(OUT)/check-kernels.txt"; exit 1; }
	$(call ptx_cache,0)
	$(call search_one,0,$(SEARCH_A)); rc=$$?; \
		cp "$(SEARCH_LOGS)/$(basename $(notdir $(SEARCH_A))).jsonl" "$(OUT)/" 2>/dev/null; tail -n 6 "$(OUT)"/*.txt; exit $$rc

# The kernels a GPU machine compiled (MLX's PTX caches and the driver's JIT cache), packed into OUT in 15 MiB
# parts at the end of a session (what comes back from the machine is at most 16 MiB a file) and unpacked from
# CACHE=DIR at the start of the next, where they go back to the same paths: a module whose source is unchanged
# is then read, not compiled (MLX names each by a hash of its source; the driver checks its own keys).
KERNEL_CACHES = /tmp/mlx /tmp/mlx-ptx-gpu0 /tmp/mlx-ptx-gpu1 $${CUDA_CACHE_PATH:-$$HOME/.nv/ComputeCache}
gpu-cache-pack gpu-cache-unpack: SHELL := /bin/bash
gpu-cache-pack gpu-cache-unpack: .SHELLFLAGS := -o pipefail -c
gpu-cache-pack:
	$(fresh_out)
	paths=$$(for p in $(KERNEL_CACHES); do test -d "$$p" && echo "$$p"; done); \
	test -n "$$paths" || { echo "error: no kernel cache on this machine ($(KERNEL_CACHES))" >&2; exit 2; }; \
	tar -cPf - $$paths | xz -T0 -6 | split -b 15M - "$(OUT)/kernel-cache.tar.xz."; \
	echo "$$(du -csh $$paths | tail -n 1 | cut -f 1) of kernel caches packed into $$(du -csh \
		"$(OUT)"/kernel-cache.tar.xz.* | tail -n 1 | cut -f 1) (OUT/kernel-cache.tar.xz.*)"
gpu-cache-unpack:
	@test -n "$(CACHE)" || { echo "error: make gpu-cache-unpack needs CACHE=DIR (the parts gpu-cache-pack wrote)" >&2; exit 2; }
	@ls "$(CACHE)"/kernel-cache.tar.xz.* >/dev/null 2>&1 || { echo "error: $(CACHE) holds no kernel-cache.tar.xz.* parts" >&2; exit 2; }
	cat "$(CACHE)"/kernel-cache.tar.xz.* | xz -d | tar -xPf - && echo "kernel caches restored from $(CACHE)"

# MLX's CUDA wheel in two transfers, not three (after ../shared/gpu/fetch-mlx-cuda): p1 takes as much of it as fits
# one call beside what travels of this checkout (tracked and unignored files, DEVICE_MARGIN_MIB spare), p2 is left
# empty, p3 holds the rest with the small wheels; boot.sh reads them as before. Stage with one call carrying p1 and
# p2, then work with p3 and boot. Refused where the two would not fit (a tree over ~19 MiB).
DEVICE_DIR ?= .device
DEVICE_MARGIN_MIB ?= 2
device-parts: SHELL := /bin/bash
device-parts: .SHELLFLAGS := -eo pipefail -c
device-parts:
	@big=$$(ls "$(DEVICE_DIR)"/mlx_cuda_13-*.whl 2>/dev/null | head -n 1 || true); no="no $(DEVICE_DIR)/mlx_cuda_13-*.whl"; \
	test -n "$$big" || { echo "error: $$no: run ../shared/gpu/fetch-mlx-cuda first" >&2; exit 2; }; \
	tree=$$(git ls-files -co --exclude-standard -z | { du -cb --files0-from=- 2>/dev/null || true; } \
		| tail -n 1 | cut -f 1); \
	room=$$(( (64 - $(DEVICE_MARGIN_MIB)) * 1048576 - tree )); size=$$(stat -c %s "$$big"); \
	small=$$(cat "$(DEVICE_DIR)"/p3/mlx-*.whl "$(DEVICE_DIR)"/p3/mlx_lm-*.whl | wc -c); \
	fits="the wheel ($$size bytes) does not fit two calls beside a $$tree-byte tree"; \
	test $$(( size - room + small )) -le $$room || { echo "error: $$fits" >&2; exit 2; }; \
	mkdir -p "$(DEVICE_DIR)"/p1 "$(DEVICE_DIR)"/p2 "$(DEVICE_DIR)"/p3; \
	head -c $$room "$$big" > "$(DEVICE_DIR)"/p1/part.aa; : > "$(DEVICE_DIR)"/p2/part.ab; \
	tail -c +$$(( room + 1 )) "$$big" > "$(DEVICE_DIR)"/p3/part.ac; \
	cmp -s "$$big" <(cat "$(DEVICE_DIR)"/p1/part.aa "$(DEVICE_DIR)"/p2/part.ab "$(DEVICE_DIR)"/p3/part.ac); \
	echo "p1 $$room bytes, p3 $$(( size - room + small )) with the small wheels, beside a $$tree-byte tree"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
