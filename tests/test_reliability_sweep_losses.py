"""Issue 6.5 at the level of a sweep: a real training run whose loss turns NaN (the trainer's ``nan_loss``
fault, injected from the sweep file) inside a sweep that goes on.

The trials are run with `run_trial`, the body of the Ray trainable, one after the other in this process (no
Ray start-up, so the test stays short), on the sweep's own SQLite study. With pruning on, the diverged trial
is pruned at its first NaN with the reason stored in the study; with pruning off it ends FAIL with the
divergence recorded. The trial after it completes: the sweep never crashes.
"""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from sweep_util import tiny_sweep

from collapse_hpo.hpo.optuna_side.pruner import trial_decisions
from collapse_hpo.hpo.sweep.config import load_sweep
from collapse_hpo.hpo.sweep.runner import create_study, locate
from collapse_hpo.hpo.sweep.trial import run_trial, trial_config

NAN_DRAW, NAN_FROM = 0, 0.3  # the first draw trains normally until t̂ = 0.3, then its loss is NaN


def _run_all(path: Path, *, no_prune: bool) -> tuple[optuna.Study, dict[int, str]]:
    """Run every planned trial of the sweep to its end; returns the study and the state each run returned."""
    sweep = load_sweep(path)
    loc = locate(sweep, no_prune=no_prune)
    loc.results.mkdir(parents=True)
    study = create_study(sweep, loc)
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    returned: dict[int, str] = {}
    while study.get_trials(states=(optuna.trial.TrialState.WAITING,)):
        trial = study.ask(dists)
        config = trial_config(sweep, loc.storage_url, loc.study_name, trial.number, loc.prune, loc.results)
        returned[trial.number] = run_trial(config)
    # Read back from the storage with a fresh handle: what is guaranteed is what the database holds.
    return optuna.load_study(study_name=loc.study_name, storage=loc.storage_url), returned


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("prune", [True, False], ids=["pruning-on", "pruning-off"])
def test_a_trial_whose_loss_turns_nan_is_ended_with_its_reason_and_the_sweep_goes_on(
        tmp_path: Path, prune: bool) -> None:
    path = tiny_sweep(tmp_path, "nan", trials=2, prune=prune,
                      faults=[{"kind": "nan_loss", "draws": [NAN_DRAW], "start_t_hat": NAN_FROM}],
                      tpp=5)  # 16K tokens per trial
    study, returned = _run_all(path, no_prune=False)
    trials = {t.user_attrs["draw"]: t for t in study.get_trials()}
    assert sorted(trials) == [0, 1]
    bad = trials[NAN_DRAW]
    assert returned[bad.number] == bad.state.name
    assert bad.user_attrs["fault"] == "nan_loss"
    steps = sorted(bad.intermediate_values)
    total = bad.user_attrs["total_tokens"]
    # The curve before the fault is stored and finite; the NaN report is stored too (it is the evidence).
    before = [bad.intermediate_values[s] for s in steps if s / total < NAN_FROM]
    assert before and all(math.isfinite(v) and v > 0 for v in before)
    assert any(math.isnan(bad.intermediate_values[s]) for s in steps)
    if prune:
        assert bad.state.name == "PRUNED"
        reason = bad.user_attrs["prune_reason"]
        assert "the run diverged; pruned at once" in reason and "loss is nan" in reason
        log = trial_decisions(bad)
        assert log and log[-1]["prune"] and log[-1]["reason"] == reason
        # Pruned at its first NaN: no report after it, and a fraction of the budget was spent.
        first_nan = min(s for s in steps if math.isnan(bad.intermediate_values[s]))
        assert steps[-1] == first_nan and NAN_FROM <= first_nan / total < NAN_FROM + 0.15
        assert bad.user_attrs["tokens_trained"] == first_nan
    else:
        assert bad.state.name == "FAIL"
        assert "the run diverged" in bad.user_attrs["error"]
        assert bad.user_attrs["final_loss"] is None and steps[-1] == total
    # The sweep went on: the trial after the diverged one trained to the end with a finite loss.
    after = trials[1]
    assert after.number > bad.number and after.state.name == "COMPLETE"
    assert math.isfinite(after.value) and after.value > 0
    assert "fault" not in after.user_attrs
    assert max(after.intermediate_values) == after.user_attrs["total_tokens"]
