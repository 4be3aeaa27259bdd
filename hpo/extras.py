"""The optional extras of the distribution, and the one-line error of a command whose extra is missing.

`pip install collapse-hpo` installs a light core (optuna, numpy, scipy, lmfit, pandas, pydantic, pyyaml): the
Optuna pruner, the predictors, and `predict`, `calibrate`, `forecast`, `replay`, `monitor` and `report`. The
heavy libraries come with extras named in pyproject.toml: a command that needs one checks for it before any
work and, when it is missing, says which extra to install (InputError: one line, exit status 2).
"""

from __future__ import annotations

import importlib.util

from collapse_hpo.predictors.errors import InputError

#: Top-level module -> the extra of pyproject.toml that installs it.
EXTRA_OF: dict[str, str] = {
    "ray": "ray",
    "torch": "train",
    "optuna_dashboard": "dashboard",
    "plotly": "dashboard",
    "matplotlib": "dashboard",
    "psycopg": "postgres",
}


def missing(*modules: str) -> list[str]:
    """The modules among ``modules`` that are not installed (looked up without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def install_hint(modules: list[str]) -> str:
    """The pip command that installs ``modules``: ``pip install 'collapse-hpo[ray,train]'``."""
    extras = sorted({EXTRA_OF[m] for m in modules})
    return f"pip install 'collapse-hpo[{','.join(extras)}]'"


def missing_note(what: str, *modules: str) -> str | None:
    """One line saying that ``what`` needs ``modules`` and how to install them; None when all are there."""
    absent = missing(*modules)
    if not absent:
        return None
    names = " and ".join(absent)
    return f"{what} needs {names}, which {'is' if len(absent) == 1 else 'are'} not installed: " \
           f"{install_hint(absent)}"


def require(what: str, *modules: str) -> None:
    """Raise InputError naming the extra to install when any of ``modules`` is missing (``what``: the command
    or option that needs them, e.g. ``"collapse-hpo run"`` or ``"--plot"``)."""
    note = missing_note(what, *modules)
    if note is not None:
        raise InputError(note)
