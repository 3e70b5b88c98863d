# The two set-up commands of the README: `make demo` and `make test`.
# Each creates (or reuses) a virtual environment in .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

demo: $(STAMP)
	$(BIN)/spec-ar demo --out out/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_overhead.py

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) out build *.egg-info
