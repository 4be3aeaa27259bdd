"""CollapsePruner between two judgements: no storage read, the same decisions (issue 13, item 1).

``should_prune()`` used to read the whole stored trial (every report, every attr) at every call; on SQLite
that grew with the curve. Now a call that is not a judgement answers from what the pruner knows of the trial
(the reports Optuna hands it, the attrs read at the last judgement plus its own writes), and a judgement
reads the stored trial as before. The decisions, logs and reasons must be the ones of the old path.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import optuna
import pytest

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

SURROGATE = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                      error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])
TAU, TPP, TOTAL, REPORTS = 0.1, 20.0, 1_000_000, 60
FINALS = (3.0, 3.4, 3.05, 3.8, 3.02, math.nan)  # the last one diverges at 30%


class NoMemory(dict):
    """Stands in for the pruner's per-trial memory and keeps nothing: every call takes the old path."""

    def __setitem__(self, key, value) -> None:
        pass


def sweep(url: str, name: str, remember: bool) -> tuple[list, int, int]:
    """Run the sweep two trials at a time; return its trials, the storage get_trial calls made inside
    should_prune, and the number of should_prune calls."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = CollapsePruner(reference=SURROGATE, total_tokens=TOTAL, tau=TAU, tpp=TPP, judge_every=0.1)
    if not remember:
        pruner._known = NoMemory()
    study = optuna.create_study(storage=url, study_name=name, direction="minimize", pruner=pruner)
    storage = study._storage
    reads = [0]
    get_trial = storage.get_trial

    def counted(trial_id):
        reads[0] += 1
        return get_trial(trial_id)

    t = np.arange(1, REPORTS + 1) / REPORTS
    shape = np.asarray(SURROGATE.normalized(t, Schedule(), TAU, TPP), dtype=float)
    calls = 0
    waiting, running = list(range(len(FINALS))), {}
    while waiting or running:
        while waiting and len(running) < 2:
            k = waiting.pop(0)
            running[k] = [study.ask(), 0]
        for k in list(running):
            trial, i = running[k]
            final = FINALS[k]
            loss = math.nan if math.isnan(final) and t[i] >= 0.3 else (3.2 if math.isnan(final) else final)
            trial.report(float(loss * shape[i]) if not math.isnan(loss) else loss, step=round(t[i] * TOTAL))
            storage.get_trial = counted
            try:
                prune = trial.should_prune()
            finally:
                storage.get_trial = get_trial
            calls += 1
            running[k][1] = i + 1
            if prune:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                del running[k]
            elif i + 1 == REPORTS:
                study.tell(trial, float(loss * shape[i]))
                del running[k]
    return study.get_trials(), reads[0], calls


@pytest.fixture
def fast(tmp_path):
    shm = "/dev/shm"
    base = tempfile.mkdtemp(prefix="collapse-hpo-between-", dir=shm if os.access(shm, os.W_OK) else None)
    yield Path(base)
    shutil.rmtree(base, ignore_errors=True)


def test_between_judgements_nothing_is_read_and_every_decision_is_the_same(fast):
    url = f"sqlite:///{fast / 'p.db'}"
    fast, fast_reads, calls = sweep(url, "remember", remember=True)
    slow, slow_reads, _ = sweep(url, "old-path", remember=False)
    judgements = sum(len(t.user_attrs.get("collapse_decisions", [])) for t in fast)
    assert {t.state.name for t in fast} == {"COMPLETE", "PRUNED"}
    assert 20 < judgements < calls / 2
    # The old path read the stored trial at every call; now only at judgements and a trial's first call.
    assert slow_reads == calls
    assert fast_reads <= judgements + len(FINALS), (fast_reads, judgements, calls)
    for a, b in zip(fast, slow, strict=True):
        assert a.state == b.state, a.number
        # NaN-aware: the NaN trial's report compares equal to itself
        np.testing.assert_equal(a.intermediate_values, b.intermediate_values, err_msg=str(a.number))
        assert a.user_attrs == b.user_attrs, a.number  # logs, predictions, reasons, controls
