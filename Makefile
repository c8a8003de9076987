# Tidewatch's two commands (see README.md):
#   make run   -- set everything up and run Tidewatch on the embedded stack (tidewatch up)
#   make test  -- set everything up (containers for the integration tests included) and run the tests
.PHONY: setup run down status test test-unit test-cluster lint format

VENV := .venv/bin
PYTEST_ARGS ?=

setup:
	scripts/setup.sh

run: setup
	$(VENV)/tidewatch up

down:
	$(VENV)/tidewatch down

status:
	$(VENV)/tidewatch status

test:
	scripts/setup.sh --with-containers
	$(VENV)/pytest $(PYTEST_ARGS)

test-cluster:
	scripts/setup.sh --with-containers
	$(VENV)/pytest -m cluster $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/pytest -m "not integration" $(PYTEST_ARGS)

lint:
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/mypy tidewatch subscriptions ingest dashboard engine

format:
	$(VENV)/ruff format .
	$(VENV)/ruff check --fix .
