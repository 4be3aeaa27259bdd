"""PyTorch Lightning integration (hpo/integrations/lightning.py) with real ``lightning`` (issue 21).

The README's example runs as it is: each trial's controls come from the Trainer and the optimizer (steps,
τ = 1/(η·λ·steps), the LambdaLR's shape) and trials are pruned in steps, from the collapse onset t̂ = τ on. A
fault injected into the weights mid-training raises the deviation alarm during ``fit`` and stops it there.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")
import optuna  # noqa: E402
from readme_util import run_readme_block  # noqa: E402
from torch_util import one_torch_thread  # noqa: E402

from collapse_hpo.hpo.integrations.alarm import CollapseAlarmWarning  # noqa: E402
from collapse_hpo.hpo.integrations.lightning import CollapseLightningCallback  # noqa: E402
from collapse_hpo.hpo.rule.record import ALARM_ATTR  # noqa: E402
from collapse_hpo.predictors.timescale import step_tau  # noqa: E402

HEADING = "### PyTorch Lightning: `CollapseLightningCallback`"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def readme():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_readme_block(HEADING)


def test_readme_example_prunes_in_steps_with_controls_from_the_trainer(readme):
    steps, tau = readme["STEPS"], readme["TAU"]
    trials = readme["study"].trials
    for t in trials:
        a, lr = t.user_attrs, t.params["lr"]
        assert (a["units"], a["total"]) == ("steps", steps)
        assert a["tau"] == pytest.approx(step_tau(lr, 1.0 / (lr * tau * steps), steps))
        assert a["tau"] == pytest.approx(tau)
        sched = a["schedule"]
        assert sched["kind"] == "data" and sched["points"][0] == [0.0, pytest.approx(0.25)]  # warm-up 1/4
        assert max(t.intermediate_values) <= steps
    # Pruned in steps, and never before the collapse onset t̂ = τ (step τ·STEPS): every trial here has the same
    # controls, which the rule compares only from there on (hpo/rule/decision.py, ``collapse_onset``).
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert pruned and all(tau * steps <= max(t.intermediate_values) < steps for t in pruned)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert complete and all(t.value is not None for t in complete)


class _Fault(pl.Callback):
    """A broken update at step ``at``: every weight gets noise."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                for p in pl_module.parameters():
                    p.add_(0.5 * torch.randn_like(p))


def _fit(readme, callbacks):
    torch.manual_seed(0)
    model = readme["Regressor"](1e-2, weight_decay=1.0 / (1e-2 * readme["TAU"] * readme["STEPS"]))
    trainer = pl.Trainer(max_steps=readme["STEPS"], callbacks=callbacks, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, readme["made_up_data"]())
    return trainer


def test_a_fault_raises_the_alarm_during_fit_and_stops_it(readme):
    clean = CollapseLightningCallback(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit(readme, [clean])
    assert clean.watch.alarm is None and len(clean.watch.curve[0]) == readme["STEPS"]
    trial = optuna.create_study().ask()
    callback = CollapseLightningCallback(trial, alarm=clean.watch.curve, stop_on_alarm=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(readme, [callback, _Fault(at=20)])
    alarm = callback.watch.alarm
    assert alarm is not None and 0.5 < alarm.t_hat < 1.0
    assert trainer.global_step == round(alarm.t_hat * readme["STEPS"]) < readme["STEPS"]
    assert any(issubclass(w.category, CollapseAlarmWarning) for w in caught)
    stored = trial.study.trials[0].user_attrs
    assert stored[ALARM_ATTR]["step"] == trainer.global_step and stored["units"] == "steps"
