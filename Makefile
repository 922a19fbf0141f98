# `make demo` and `make test` work on a fresh clone with only python3: they create .venv when missing.
# torch==2.13.0 (the `torch` extra) is pinned: pip takes the CPU build, not gigabytes of CUDA.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/allreduce run -n 4 -- $(PY) examples/demo.py
	$(VENV)/bin/allreduce run -n 4 -- $(PY) examples/train.py --epochs 3
	$(VENV)/bin/allreduce bench -n 4 -b 8 -e 4M -f 8 --iters 10 --warmup 2 --algorithm ring,tree

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/allreduce bench -n 2 -b 8 -e 64M -f 4 --algorithm ring,tree
	$(VENV)/bin/allreduce bench -n 4 -b 8 -e 64M -f 4 --algorithm ring,tree

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .hypothesis
