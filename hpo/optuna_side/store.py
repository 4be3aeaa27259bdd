"""The one writer of a decision to an Optuna trial, for both adapters (issue 22).

The Optuna pruner (hpo/optuna_side/pruner.py) and the Ray scheduler's Optuna mirror
(hpo/ray_side/scheduler.py) write the same user attrs (names in hpo/rule/record.py): a new entry appended
to the decision log (``DECISIONS_ATTR``), the latest-decision attrs (``DecisionEntry.latest_attrs``), a
``prune_reason``, and the sampler point of a pruned trial (``report_prediction``: the attr
``SAMPLER_STEP_ATTR`` and the predicted final loss as an intermediate value at the final step). They write
them here; each adapter keeps only *when* it writes (its own dispatch on the judge's ``Verdict``).

Each writer takes ``attrs``, the trial's user attrs as the adapter last read them (a ``FrozenTrial``'s, or
what the pruner knows between judgements); the latest attrs and the reason are written only where they
differ. ``storage`` is an Optuna storage or
anything with its ``set_trial_user_attr`` and ``set_trial_intermediate_value`` (the pruner's recording
stand-in). Attrs are written in a fixed order (``latest_attrs``' order: bounds before the point prediction).

Known drift, kept on purpose (issue 22: "behaviour unchanged"): the pruner writes the sampler point at the
judgement that prunes the trial, and not when that step was already reported; the mirror writes it when the
Tune trial finishes as pruned, without that check. Likewise, the pruner rewrites the latest attrs from a
recalled entry, the mirror does not. Unifying them changes what a study holds; it is a later step.

The trial's other writes go through here too: the mirror's reports (``write_report``), final states
(``complete``, ``prune``, ``fail``, which the sweep's runner uses for the trials it fails), and a study's
warnings (``record_warning``).

Private Optuna API: every use of the sweep's and both adapters' lives here (``storage_of``, ``trial_id_of``,
``study_id_of``, ``trial_id_by_number``, ``record_heartbeat``, ``heartbeat_ages``), each with a comment
saying why; tests/test_private_apis.py fails loudly when Optuna changes one. Two stay where they are used:
hpo/sweep/runner.py overrides ``Study._pop_waiting_trial_id`` (a subclass, ``plan_order_study``), and
hpo/outputs/dashboard.py builds a ``Trial`` from ``FrozenTrial._trial_id`` (that room may not import this
one: ARCHITECTURE.md's table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from collapse_hpo.hpo.rule.judge import JudgeWarning, add_warning
from collapse_hpo.hpo.rule.record import (
    DECISIONS_ATTR,
    FINAL_LOSS_ATTR,
    PRUNE_REASON_ATTR,
    SAMPLER_STEP_ATTR,
    WARNINGS_ATTR,
    DecisionEntry,
)

if TYPE_CHECKING:  # Optuna only names types here: importing this module (the Ray scheduler does) loads none
    import optuna
    from optuna.trial import FrozenTrial

__all__ = [
    "FAIL_REASON_ATTR", "append_entry", "complete", "fail", "heartbeat_ages", "prune", "record_heartbeat",
    "record_warning", "storage_of", "study_id_of", "trial_id_by_number", "trial_id_of", "write_latest",
    "write_reason", "write_report", "write_sampler_point", "write_total",
]

#: The user attr of a mirrored trial that failed: why (the Tune trial's error).
FAIL_REASON_ATTR = "fail_reason"


def storage_of(study: optuna.study.Study) -> Any:
    """The study's storage.

    Private Optuna API, on purpose: a pruner gets only ``(study, FrozenTrial)``, and Optuna offers no public
    way to write a user attr to a trial from there, nor to read the trial's latest stored version (another
    worker's reports); Optuna does not persist pruner objects, so the decision state must live in the
    storage. The Ray scheduler's mirror writes to a trial it holds no ``Trial`` handle for (Tune calls it from
    its controller, and a restored driver has only the trial's id in the state file), and Optuna has no
    public "write to trial by id". ``tests/test_private_apis.py`` fails loudly when Optuna renames it.
    """
    return study._storage


def trial_id_of(trial: FrozenTrial | optuna.trial.Trial) -> int:
    """A stored trial's storage id, for ``storage_of``'s reads and writes (private Optuna API; same test)."""
    return trial._trial_id


def study_id_of(study: optuna.study.Study) -> int:
    """The study's storage id (private ``Study._study_id``): the sweep's runner lists and finds its trials in
    the storage by it, and Optuna offers no public accessor for it (same test)."""
    return study._study_id


def trial_id_by_number(study: optuna.study.Study, number: int) -> int:
    """The storage id of the study's trial ``number``: the sweep's driver knows a Tune trial's Optuna number
    only (Optuna's public API finds a trial by number only by listing every trial)."""
    return storage_of(study).get_trial_id_from_study_id_trial_number(study_id_of(study), number)


def record_heartbeat(study: optuna.study.Study, trial: optuna.trial.Trial) -> None:
    """Record a heartbeat of a trial the sweep's driver just asked for (before a worker beats for it), so
    that ``heartbeat_ages`` never finds it silent. Optuna records heartbeats only inside ``study.optimize``;
    the storage's ``record_heartbeat`` is its one way from outside."""
    storage_of(study).record_heartbeat(trial_id_of(trial))


def heartbeat_ages(storage: Any, study_id: int) -> dict[int, float | None]:
    """Seconds since the last heartbeat of each RUNNING trial (None: never recorded one), by trial id."""
    # Private Optuna API (optuna.storages._rdb.models), on purpose: the public check
    # (optuna.storages.fail_stale_trials) gives no ages and never fails a trial that recorded no heartbeat
    # (a worker that died before its first beat), which resume must rerun. tests/test_private_apis.py fails
    # loudly when Optuna changes these models.
    import optuna
    import sqlalchemy
    from optuna.storages._rdb import models

    rdb = getattr(storage, "_backend", storage)  # optuna wraps an RDBStorage in a _CachedStorage
    out: dict[int, float | None] = {}
    with rdb.scoped_session() as session:
        now = session.execute(sqlalchemy.func.now()).scalar().replace(tzinfo=None)
        rows = (session.query(models.TrialModel)
                .filter(models.TrialModel.study_id == study_id)
                .filter(models.TrialModel.state == optuna.trial.TrialState.RUNNING).all())
        for row in rows:
            beats = list(row.heartbeats)
            out[row.trial_id] = (now - beats[0].heartbeat).total_seconds() if beats else None
    return out


def append_entry(storage: Any, trial_id: int, attrs: Mapping[str, Any], entry: DecisionEntry) -> None:
    """A judgement: append ``entry`` to the trial's decision log, then make the latest attrs match it."""
    log = list(attrs.get(DECISIONS_ATTR) or [])
    storage.set_trial_user_attr(trial_id, DECISIONS_ATTR, [*log, entry.to_dict()])
    write_latest(storage, trial_id, attrs, entry)


def write_latest(storage: Any, trial_id: int, attrs: Mapping[str, Any], entry: DecisionEntry) -> None:
    """Make the latest-decision attrs match a log entry (the prediction attrs only when it has a prediction);
    an attr already equal is not written."""
    for key, value in entry.latest_attrs().items():
        if attrs.get(key, object()) != value:
            storage.set_trial_user_attr(trial_id, key, value)


def write_reason(storage: Any, trial_id: int, attrs: Mapping[str, Any], reason: str) -> None:
    """Set the trial's ``prune_reason`` (one line) unless it already says so."""
    if attrs.get(PRUNE_REASON_ATTR) != reason:
        storage.set_trial_user_attr(trial_id, PRUNE_REASON_ATTR, reason)


def write_sampler_point(storage: Any, trial_id: int, point: tuple[int, float]) -> None:
    """A pruned trial's sampler point ``(step, value)`` (``record.sampler_value``: the predicted final loss at
    the final step, in the trial's units): the step in ``SAMPLER_STEP_ATTR`` first, so readers that skip
    it (``record.trial_points``) never take the value for a report, then the value as an intermediate
    value."""
    storage.set_trial_user_attr(trial_id, SAMPLER_STEP_ATTR, point[0])
    storage.set_trial_intermediate_value(trial_id, point[0], point[1])


def record_warning(study: optuna.study.Study, warning: JudgeWarning) -> bool:
    """Add a warning to the study user attr ``collapse_warnings`` (``WARNINGS_ATTR``) unless its key is there;
    True if added. The one writer of a study's warnings: the pruner, the Ray mirror and the sweep's runner
    record them here, and say them on the console with ``judge.emit``."""
    updated = add_warning(study.user_attrs.get(WARNINGS_ATTR), warning)
    if updated is None:
        return False
    study.set_user_attr(WARNINGS_ATTR, updated)
    return True


def write_report(storage: Any, trial_id: int, step: int, value: float) -> None:
    """A report (``value`` at ``step``, the pruner's units) as the trial's intermediate value."""
    storage.set_trial_intermediate_value(trial_id, step, value)


def write_total(storage: Any, trial_id: int, total: float) -> None:
    """The trial's training length (user attr ``total``, in its units), when known only from its results."""
    storage.set_trial_user_attr(trial_id, "total", total)


def complete(storage: Any, trial_id: int, final_loss: float) -> None:
    """Finish the trial COMPLETE with its final loss (also the user attr ``FINAL_LOSS_ATTR``)."""
    import optuna

    storage.set_trial_user_attr(trial_id, FINAL_LOSS_ATTR, final_loss)
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.COMPLETE, [final_loss])


def prune(storage: Any, trial_id: int, values: list[float] | None) -> None:
    """Finish the trial PRUNED (``values``: its last step's value, or None)."""
    import optuna

    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.PRUNED, values)


def fail(storage: Any, trial_id: int, attrs: Mapping[str, Any]) -> None:
    """Finish the trial FAIL after writing ``attrs`` (why, in order: the mirror's ``FAIL_REASON_ATTR``, the
    sweep's ``error``, ...). Raises Optuna's UpdateFinishedTrialError when it finished meanwhile."""
    import optuna

    for key, value in attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL)
