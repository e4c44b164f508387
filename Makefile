# lifelong-controller: every target works from a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test soak lint schemas serve demo clean bench bench-full

install: $(STAMP)

# the editable install also compiles the one C module in place: a changed source rebuilds it
$(STAMP): pyproject.toml setup.py service/adapters/_lines.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check service tests bench
	$(BIN)/mypy

schemas: install
	$(BIN)/lifelong schemas

# Three workers: most tests wait on the servers they start (each on its own free ports), so
# the suite takes about half the time it takes on one, even on two cores. Work stealing: a
# worker that runs out takes pending tests from the others, so a few long tests at the end
# of the collection do not leave two workers idle while the third runs them one by one.
test: install lint
	$(BIN)/pytest -q -p no:cacheprovider -n 3 --dist worksteal

# Redis failover soaks (Sentinel, Cluster; several kill points, many rounds): minutes each
soak: install
	$(BIN)/pytest -q -p no:cacheprovider -m soak

serve: install
	$(BIN)/lifelong serve --embedded

demo: install
	$(BIN)/lifelong demo

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache service/adapters/_lines.*.so

bench: install
	$(BIN)/python -m bench

bench-full: install
	$(BIN)/python -m bench --full --out bench/results-full.json
