# jaxattn: `make run` (the demo) and `make test` (the test suite). Both create
# `.venv` and install the package into it when needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jaxattn-installed

.PHONY: run test test-slow lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/jaxattn demo

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -q

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxattn tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
