"""Every private Optuna or Ray API collapse-hpo still uses, checked: a library change fails here, loudly.

Each use has a comment at its call site saying why no public API serves:

- hpo/optuna_side/store.py ``storage_of`` and ``trial_id_of``: ``Study._storage`` and
  ``FrozenTrial._trial_id``, for the pruner (it must write its decision to the trial; Optuna gives a
  pruner only ``(study, FrozenTrial)`` and does not persist pruners) and for the Ray scheduler's Optuna
  mirror of Tune trials (it writes to a trial by id); the pruner and the scheduler read neither directly;
- hpo/ray_side/scheduler.py ``_default_state_paths``: Tune's ``Trial.storage`` (``StorageContext``) paths;
- hpo/sweep/runner.py ``_heartbeat_ages``: ``optuna.storages._rdb.models`` (heartbeat ages, trials never
beating);
  hpo/sweep/runner.py also reads ``Study._storage`` and ``Study._study_id`` (its searcher writes to trials by
  id);
- hpo/outputs/dashboard.py ``publish``: ``FrozenTrial._trial_id`` (optuna-dashboard's ``save_note`` takes a
Trial).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import optuna
import pytest

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
from collapse_hpo.hpo.optuna_side.store import storage_of, trial_id_of
from collapse_hpo.hpo.rule.record import DECISIONS_ATTR
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE


def test_study_storage_and_frozen_trial_id_still_write_to_the_trial():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    trial = study.ask()
    frozen = study.get_trials(deepcopy=False)[0]
    storage, trial_id = storage_of(study), trial_id_of(frozen)
    storage.set_trial_user_attr(trial_id, "probe", 1)
    assert study.get_trials()[0].user_attrs["probe"] == 1
    assert storage.get_trial(trial_id).number == trial.number


def test_the_pruner_and_the_mirror_reach_them_only_through_the_store():
    root = Path(__file__).resolve().parents[1] / "hpo"
    for path in (root / "optuna_side" / "pruner.py", root / "ray_side" / "scheduler.py"):
        found = re.findall(r"\._(?:storage|trial_id)\b", path.read_text())
        assert not found, f"{path.name} reads {found}: use hpo/optuna_side/store.py's storage_of/trial_id_of"


def test_the_pruner_writes_its_log_through_those_apis():
    pruner = CollapsePruner(reference=TRUE_SURROGATE, total_tokens=1000, tau=0.2, tpp=20.0, min_fraction=0.1)
    study = optuna.create_study(pruner=pruner)
    trial = study.ask()
    trial.report(float("nan"), 500)
    assert trial.should_prune()
    assert study.get_trials()[0].user_attrs[DECISIONS_ATTR][-1]["prune"] is True


def test_rdb_heartbeat_models_still_give_heartbeat_ages(tmp_path):
    from collapse_hpo.hpo.sweep.runner import _heartbeat_ages

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'hb.db'}", heartbeat_interval=60)
    study = optuna.create_study(storage=storage, study_name="hb")
    beating, silent = study.ask(), study.ask()
    storage.record_heartbeat(trial_id_of(study.get_trials()[beating.number]))
    ages = _heartbeat_ages(storage, storage.get_study_id_from_name("hb"))
    by_number = {storage.get_trial(tid).number: age for tid, age in ages.items()}
    assert by_number[silent.number] is None
    assert by_number[beating.number] is not None and 0 <= by_number[beating.number] < 60


def test_tune_storage_context_still_has_the_paths_the_scheduler_reads():
    from ray.train._internal.storage import StorageContext
    from ray.tune.experiment import Trial

    for name in ("experiment_driver_staging_path", "experiment_fs_path"):
        assert isinstance(getattr(StorageContext, name, None), property), name
    assert "storage_filesystem" in inspect.signature(StorageContext.__init__).parameters
    assert "storage" in inspect.signature(Trial.__init__).parameters


@pytest.mark.parametrize("name", ["_storage", "_study_id"])
def test_study_private_attributes_exist(name):
    study = optuna.create_study()
    assert hasattr(study, name), f"optuna.Study.{name} is gone: see the call sites listed in this module"
