"""Every private Optuna or Ray API collapse-hpo still uses, checked: a library change fails here, loudly.

Each use has a comment at its call site saying why no public API serves:

- hpo/optuna_side/store.py, the home of the Optuna ones: ``storage_of`` and ``trial_id_of``
  (``Study._storage``, ``FrozenTrial._trial_id``/``Trial._trial_id``), for the pruner (it must write its
  decision to the trial; Optuna gives a pruner only ``(study, FrozenTrial)`` and does not persist pruners),
  for the Ray scheduler's Optuna mirror of Tune trials (it writes to a trial by id) and for the sweep's
  runner (its searcher writes to trials by id); ``study_id_of`` (``Study._study_id``), ``trial_id_by_number``
  and ``record_heartbeat``, for the runner; ``heartbeat_ages``: ``optuna.storages._rdb.models`` (heartbeat
  ages, trials never beating). The pruner, the scheduler and the runner read none of them directly;
- hpo/sweep/runner.py ``plan_order_study``: overrides ``Study._pop_waiting_trial_id`` (which queued trial
  ``ask`` returns);
- hpo/ray_side/scheduler.py ``_default_state_paths``: Tune's ``Trial.storage`` (``StorageContext``) paths;
- hpo/outputs/dashboard.py ``publish``: ``FrozenTrial._trial_id`` (optuna-dashboard's ``save_note`` takes a
  Trial; the outputs room may not import hpo/optuna_side, so this one stays there).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import optuna
import pytest

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
from collapse_hpo.hpo.optuna_side.store import (
    heartbeat_ages,
    record_heartbeat,
    storage_of,
    study_id_of,
    trial_id_by_number,
    trial_id_of,
)
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


def test_the_pruner_the_mirror_and_the_runner_reach_them_only_through_the_store():
    root = Path(__file__).resolve().parents[1] / "hpo"
    for path in (root / "optuna_side" / "pruner.py", root / "ray_side" / "scheduler.py",
                 root / "sweep" / "runner.py"):
        found = re.findall(r"\._(?:storage|trial_id|study_id|backend)\b|storages\._rdb", path.read_text())
        assert not found, f"{path.name} reads {found}: use hpo/optuna_side/store.py's accessors"


def test_study_id_trial_by_number_and_heartbeat_still_work(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'ids.db'}", heartbeat_interval=60)
    study = optuna.create_study(storage=storage, study_name="ids")
    study.ask()
    trial = study.ask()
    assert study_id_of(study) == storage.get_study_id_from_name("ids")
    tid = trial_id_by_number(study, trial.number)
    assert tid == trial_id_of(trial) and storage.get_trial(tid).number == trial.number
    record_heartbeat(study, trial)
    ages = heartbeat_ages(storage, study_id_of(study))
    assert ages[tid] is not None and 0 <= ages[tid] < 60


def test_ask_still_takes_the_queued_trial_from_pop_waiting_trial_id():
    """hpo/sweep/runner.py ``plan_order_study`` overrides it to serve the queue in plan order."""
    calls: list[int | None] = []

    class Probe(optuna.Study):
        def _pop_waiting_trial_id(self) -> int | None:
            got = super()._pop_waiting_trial_id()
            calls.append(got)
            return got

    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="pop").enqueue_trial({"x": 1.0})
    probe = Probe(study_name="pop", storage=storage)
    trial = probe.ask()
    assert calls and calls[0] == trial_id_of(trial)


def test_the_pruner_writes_its_log_through_those_apis():
    pruner = CollapsePruner(reference=TRUE_SURROGATE, total_tokens=1000, tau=0.2, tpp=20.0, min_fraction=0.1)
    study = optuna.create_study(pruner=pruner)
    trial = study.ask()
    trial.report(float("nan"), 500)
    assert trial.should_prune()
    assert study.get_trials()[0].user_attrs[DECISIONS_ATTR][-1]["prune"] is True


def test_rdb_heartbeat_models_still_give_heartbeat_ages(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'hb.db'}", heartbeat_interval=60)
    study = optuna.create_study(storage=storage, study_name="hb")
    beating, silent = study.ask(), study.ask()
    storage.record_heartbeat(trial_id_of(study.get_trials()[beating.number]))
    ages = heartbeat_ages(storage, storage.get_study_id_from_name("hb"))
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
