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

Private Optuna API: ``storage_of`` and ``trial_id_of`` are the two adapters' only ones (see their
docstrings); tests/test_private_apis.py fails loudly when Optuna renames them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from collapse_hpo.hpo.rule.record import DECISIONS_ATTR, PRUNE_REASON_ATTR, SAMPLER_STEP_ATTR, DecisionEntry

if TYPE_CHECKING:  # Optuna only names types here: importing this module (the Ray scheduler does) loads none
    import optuna
    from optuna.trial import FrozenTrial

__all__ = [
    "append_entry", "storage_of", "trial_id_of", "write_latest", "write_reason", "write_sampler_point",
]


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


def trial_id_of(trial: FrozenTrial) -> int:
    """A stored trial's storage id, for ``storage_of``'s reads and writes (private Optuna API; same test)."""
    return trial._trial_id


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
