# `make demo` and `make test` work on a fresh clone with only python3: they create .venv when missing.
# torch==2.13.0 is pinned here (the `torch` extra allows a range): pip takes the CPU build on disk, not
# gigabytes of CUDA.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-tensorflow native asan fuzz fuzz-frames bench clean torch-conformance torch-elastic docs slurm ray deploy-test netns-bench campaign

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,torch]' 'torch==2.13.0'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/allreduce run -n 4 -- $(PY) examples/demo.py
	$(VENV)/bin/allreduce run -n 4 -- $(PY) examples/train.py --epochs 3
	$(VENV)/bin/allreduce bench -n 4 -b 8 -e 4M -f 8 --iters 10 --warmup 2 --algorithm ring,tree

# TensorFlow's face (allreduce.tensorflow, tests/tf) in a venv of its own, since TensorFlow pins its own
# numpy and ml_dtypes; `make test` runs those tests only where TensorFlow is importable (they skip otherwise).
TF_VENV := .venv-tf
test-tensorflow:
	test -x $(TF_VENV)/bin/python || $(PYTHON) -m venv $(TF_VENV)
	$(TF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TF_VENV)/bin/python -m pip install --quiet -e '.[dev,tensorflow]'
	$(TF_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/tf

# The compiled engine (src/allreduce/native/*.c), rebuilt in place when its sources change; `pip install`
# builds it too. Without a C compiler the build says so and the suite runs on the Python engine alone.
NATIVE_SOURCES := $(wildcard src/allreduce/native/*.c src/allreduce/native/*.h) setup.py
NATIVE_STAMP := $(VENV)/.native-built
$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	$(PY) setup.py --quiet build_ext --inplace
	touch $(NATIVE_STAMP)

native: $(NATIVE_STAMP)

# ruff first (pyproject.toml's [tool.ruff]); mypy --strict runs inside pytest (tests/unit/test_typing.py).
LINTED := src tests benchmarks examples scripts fuzz
test: $(STAMP) $(NATIVE_STAMP)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m pytest -q

# The compiled engine built with AddressSanitizer (gcc's libasan preloaded into Python), then the native
# tests (the reader's fuzz included) and the lines' collective and fault tests on it; then the usual build
# again. A memory error aborts the rank that made it, and its test fails.
ASAN_TESTS := tests/native tests/collectives/test_small_messages.py tests/collectives/test_chunked_lines.py \
	tests/faults/test_mismatch.py
asan: $(STAMP)
	CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g" LDFLAGS="-fsanitize=address" \
	  $(PY) setup.py --quiet build_ext --inplace --force --build-temp build/asan
	LD_PRELOAD=$$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 TEST_ENGINES=native \
	  $(PY) -m pytest -q -p no:cacheprovider $(ASAN_TESTS); \
	status=$$?; $(PY) setup.py --quiet build_ext --inplace --force && touch $(NATIVE_STAMP); exit $$status

# The lines' reader fuzzed longer than the suite does (tests/native/test_fuzz_lines.py), and the TCP
# engine's frame parser under libFuzzer.
fuzz: $(STAMP) $(NATIVE_STAMP) fuzz-frames
	LINES_FUZZ_ROUNDS=500000 $(PY) -m pytest -q -p no:cacheprovider tests/native/test_fuzz_lines.py

# The frame header parser (native/frames.c) under libFuzzer with ASan and UBSan for FUZZ_SECONDS
# (default 300); the suite runs it for a few seconds. Needs clang (apt-get install clang): skips,
# saying so, where it is missing.
FUZZ_SECONDS ?= 300
FUZZ_DIR := build/fuzz
fuzz-frames:
	@if ! command -v clang >/dev/null 2>&1; then \
	  echo "make fuzz-frames: skipped: clang is not installed (apt-get install clang)"; exit 0; fi; \
	mkdir -p $(FUZZ_DIR)/corpus && \
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc/allreduce/native \
	  fuzz/frame_header.c src/allreduce/native/frames.c -o $(FUZZ_DIR)/frame_header && \
	$(FUZZ_DIR)/frame_header -max_total_time=$(FUZZ_SECONDS) -max_len=128 -print_final_stats=1 $(FUZZ_DIR)/corpus

bench: $(STAMP)
	$(VENV)/bin/allreduce bench -n 2 -b 8 -e 64M -f 4 --algorithm ring,tree
	$(VENV)/bin/allreduce bench -n 4 -b 8 -e 64M -f 4 --algorithm ring,tree

# torch's own distributed test base (tests/torch/distributed_test_driver.py) on "allreduce", every test,
# at world sizes 2 and 3, ranks forked; CONFORMANCE_BACKENDS="gloo allreduce" adds the baseline, and
# CONFORMANCE_START=spawn starts ranks as upstream does (hours on two cores).
CONFORMANCE_BACKENDS ?= allreduce
CONFORMANCE_START ?= fork
torch-conformance: $(STAMP)
	$(PY) -m pip install --quiet expecttest
	status=0; for backend in $(CONFORMANCE_BACKENDS); do for size in 2 3; do \
	  echo "== $$backend, world size $$size"; \
	  CONFORMANCE_START=$(CONFORMANCE_START) BACKEND_UNDER_TEST=$$backend WORLD_SIZE=$$size \
	    $(PY) -m pytest -q -p no:cacheprovider -rfE \
	    tests/torch/distributed_test_driver.py || status=1; \
	done; done; exit $$status

# Elastic torchrun with a worker SIGKILLed mid-training: the restart from a checkpoint (backend
# "allreduce") and the survivors of a lost node re-forming a group (our API); about a minute.
torch-elastic: $(STAMP)
	$(PY) -m pytest -q -rs -m slow tests/torch/test_torch_elastic.py

# The documentation site (MkDocs + mkdocstrings) into site/; --strict turns any warning into a failure.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Deployment under real engines (docs/deployment.md). `slurm` installs and starts a single-node Slurm
# (root; Debian's slurm-wlm and munge; scripts/slurm-down.sh stops it); `ray` installs the optional Ray
# extra; `deploy-test` runs every test of tests/deploy, the slow ones too (each engine's tests skip where
# it is absent); `netns-bench` times all-reduce across rate-capped network namespaces (root).
slurm:
	sh scripts/slurm-up.sh

ray: $(STAMP)
	$(PY) -m pip install --quiet -e '.[ray]'

deploy-test: $(STAMP)
	$(PY) -m pytest -q -rs -m 'slow or not slow' tests/deploy

netns-bench: $(STAMP)
	$(PY) benchmarks/netns_bench.py --per-host 1
	$(PY) benchmarks/netns_bench.py --per-host 2

# The reliability campaign of docs/reliability.md: 200 ranks killed, 30 frozen (SIGSTOP), 12 links cut
# (network namespaces, root only; skipped otherwise), at random moments; about 15 minutes on two cores.
campaign: $(STAMP)
	$(PY) benchmarks/reliability_campaign.py --kills 200 --stops 30 --cuts 12 --seed 1

clean:
	rm -rf $(VENV) $(TF_VENV) build site *.egg-info src/*.egg-info .pytest_cache .hypothesis
