# Set-up and entry points. `make quickstart` and `make test` are the README's two commands: each builds the
# virtual environment on first use, so a fresh machine needs nothing else.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: setup quickstart test lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet $(PIP_FLAGS) -e '.[dev]'
	touch $@

quickstart: setup
	$(VENV)/bin/collapse-hpo run studies/quickstart.yaml

lint: setup
	$(VENV)/bin/ruff check .

test: lint
	$(VENV)/bin/pytest

clean:
	rm -rf $(VENV) results .pytest_cache
