# lifelong-controller: every target works from a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint schemas serve clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check service tests
	$(BIN)/mypy

schemas: install
	$(BIN)/lifelong schemas

test: install lint
	$(BIN)/pytest -q -p no:cacheprovider

serve: install
	$(BIN)/lifelong serve --embedded

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
