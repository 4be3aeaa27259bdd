# Set-up and entry points. `make quickstart` and `make test` are the README's two commands: each builds the
# virtual environment on first use, so a fresh machine needs nothing else.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: setup quickstart test lint bench clean

setup: $(VENV)/.installed

# The tested torch and triton go in first, exactly: the `train` extra's ranges alone would resolve torch to the
# newest multi-GB CUDA build; installed first, they satisfy those ranges and pip keeps them. Then the package,
# editable, with every extra and the test tools (`dev`).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet $(PIP_FLAGS) torch==2.13.0 \
		"triton==3.7.1; sys_platform == 'linux' and platform_machine == 'x86_64'"
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
