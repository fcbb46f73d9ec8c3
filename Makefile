# Developer entry points. The README's two commands need nothing but Python; these are
# shortcuts for the same things and for the long runs kept out of the default suite.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-pg docs-test lint chaos chaos-ci bench upkeep-bench ci

$(VENV)/bin/orchestration:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'

install: $(VENV)/bin/orchestration

demo: install
	$(VENV)/bin/orchestration demo

test: install
	$(VENV)/bin/pytest -n 2

# The unit tier on PostgreSQL instead of SQLite (docs/contributing.md): each xdist worker makes
# its own databases on this server, and drops them when it is done.
ORCH_TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test
test-pg: install
	ORCH_TEST_UNIT_DATABASE=postgresql ORCH_TEST_DATABASE_URL=$(ORCH_TEST_DATABASE_URL) \
		$(VENV)/bin/pytest -n 2 tests/unit

# Every runnable command block of README.md and docs/*.md, as written, from a fresh shell
# (docs/contributing.md); needs the services the docs name (PostgreSQL, Redis).
docs-test: install
	$(VENV)/bin/pytest -m docs tests/docs

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

chaos: install
	$(PY) -m chaos --profile full --report chaos-report.json --doc docs/reliability.md

chaos-ci: install
	$(VENV)/bin/pytest -m chaos tests/chaos

# Item 1 also times the peers (celery-director, DBOS Transact, Prefect 3), each from its own
# virtualenv, made with pip on first use (`python -m bench --help`: --*-venv, --peers).
bench: install
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	$(PY) -m bench --report bench-results/report.json

# Issue 13's closing figures: prune on 100k old runs beside live ones, its effect on a
# concurrent sweep and /metrics, and a 20 MB artifact's read time (docs/benchmarks.md, "Upkeep").
UPKEEP_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test
upkeep-bench: install
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	$(PY) -m bench.upkeep --database-url $(UPKEEP_DATABASE_URL) --json bench-results/upkeep.json

ci:
	bash .ci/run
