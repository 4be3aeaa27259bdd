"""Studies named on the command line by ``--storage URL`` (and ``--study NAME``): any Optuna study, made by a
sweep, a plain Optuna objective, Ray Tune's mirror (``CollapseScheduler(storage=...)``) or Hugging Face's
``hyperparameter_search``. Used by `report` and `dashboard`; every problem is one InputError line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collapse_hpo.hpo.sweep.storage_errors import StorageFault
from collapse_hpo.hpo.sweep.urls import mask_url, resolve_url, sqlite_file, url_problem
from collapse_hpo.predictors.errors import InputError

if TYPE_CHECKING:
    import optuna


def storage_for(url: str, flag: str = "--storage") -> str:
    """The URL to open for ``url`` as given with ``flag``: a ``${NAME}`` URL read from the environment, the
    scheme checked, a SQLite file that must exist (a report or a dashboard never creates one), and the
    PostgreSQL driver named (hpo/sweep/trial.py ``storage_url``)."""
    from collapse_hpo.hpo.sweep.trial import storage_url  # deferred: pulls pydantic; --help stays fast

    url = resolve_url(url, flag)
    problem = url_problem(url)
    if problem:
        raise InputError(f"{flag}: {problem}")
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise InputError(f"{flag} {mask_url(url)}: no such SQLite file ({path}); give the file the study "
                         "is in")
    return storage_url(url)


def study_names(url: str, flag: str = "--storage") -> list[str]:
    """The names of the studies in the storage at ``url`` (from `storage_for`), sorted."""
    import optuna

    try:
        return sorted(optuna.get_all_study_names(storage=url))
    except StorageFault:
        raise
    except Exception as err:  # a server that refuses, a file that is not an Optuna database
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"{flag} {mask_url(url)}: cannot open it ({first[:200]}); check the URL") from None


def load_named_study(url: str, name: str | None, flag: str = "--storage") -> optuna.Study:
    """The study ``name`` in the storage at ``url`` (from `storage_for`); without a name, the storage's only
    study. InputError listing the studies there when the name is missing, unknown or ambiguous."""
    import optuna

    names = study_names(url, flag)
    shown = mask_url(url)
    listed = ", ".join(repr(n) for n in names[:20])
    if len(names) > 20:
        listed += f" and {len(names) - 20} more"
    if not names:
        raise InputError(f"{flag} {shown}: holds no study")
    if name is None:
        if len(names) > 1:
            raise InputError(f"{flag} {shown}: holds {len(names)} studies ({listed}); choose one with "
                             "--study")
        name = names[0]
    elif name not in names:
        raise InputError(f"--study {name!r}: no such study in {shown}; the studies there: {listed}")
    return optuna.load_study(study_name=name, storage=url)
