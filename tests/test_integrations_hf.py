"""Hugging Face integration (hpo/integrations/huggingface.py) with real ``transformers`` (issue 21).

A tiny GPT-2 built from a config, on made-up tokens, no download: the README's
``hyperparameter_search`` example runs as it is, and every trial's controls are read from the
``TrainingArguments`` (steps, cosine with its warm-up, τ = 1/(η·λ·steps), TPP from the model's size) and
judged in optimizer steps; the callback in a user's own objective reports the training loss in steps, and a
fault injected into the weights mid-training raises the deviation alarm and ends training there.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import optuna  # noqa: E402
from readme_util import run_readme_block  # noqa: E402
from torch_util import one_torch_thread  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from collapse_hpo.hpo.integrations.alarm import CollapseAlarmWarning  # noqa: E402
from collapse_hpo.hpo.integrations.huggingface import (  # noqa: E402
    CollapseCallback,
    controls_from_args,
    non_embedding_params,
)
from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner  # noqa: E402
from collapse_hpo.hpo.rule.record import ALARM_ATTR  # noqa: E402
from collapse_hpo.predictors.errors import InputError  # noqa: E402
from collapse_hpo.predictors.schedules import Schedule  # noqa: E402
from collapse_hpo.predictors.timescale import step_tau  # noqa: E402

HEADING = "### Hugging Face: `collapse_hp_space` and `CollapseCallback`"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    import os

    here, where = os.getcwd(), tmp_path_factory.mktemp("hf")
    os.chdir(where)  # the example writes hf.db and hf_out/ where it runs
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ns = run_readme_block(HEADING)
    finally:
        os.chdir(here)
    ns["storage_url"] = f"sqlite:///{where / 'hf.db'}"
    return ns


def test_readme_search_sets_each_trials_controls_from_the_training_arguments(readme):
    study = optuna.load_study(study_name="hf-lr", storage=readme["storage_url"])
    steps, length = readme["STEPS"], readme["LENGTH"]
    n = non_embedding_params(readme["model_init"]())
    for t in study.trials:
        a, lr = t.user_attrs, t.params["learning_rate"]
        assert (a["units"], a["total"]) == ("steps", steps)
        assert a["schedule"] == {"kind": "cosine", "warmup": 3 / steps, "final": 0.0}
        assert a["tau"] == pytest.approx(step_tau(lr, 1.0 / (lr * readme["TAU"] * steps), steps))
        assert a["tau"] == pytest.approx(readme["TAU"])
        assert a["tpp"] == pytest.approx(steps * 8 * length / n)
        assert max(t.intermediate_values) <= steps  # Hugging Face's own reports: eval loss at its steps
        for entry in a.get("collapse_decisions", []):
            assert entry["t_hat"] == pytest.approx(entry["step"] / steps)
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") >= 1 and "PRUNED" in states  # the worse learning rates were stopped
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert all(max(t.intermediate_values) < steps for t in pruned)


def _args(tmp_path, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=str(tmp_path / "out"), max_steps=30, per_device_train_batch_size=8,
                learning_rate=3e-3, weight_decay=0.1, lr_scheduler_type="cosine", warmup_steps=3,
                logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
                disable_tqdm=True)
    return TrainingArguments(**{**base, **kw})


class _Fault(TrainerCallback):
    """A broken update at step ``at``: every weight gets noise (as from a bad shard or a bit flip)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, model=None, **kw):
        if state.global_step == self.at:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.3 * torch.randn_like(p))


def _train(readme, tmp_path, callbacks):
    from transformers import Trainer

    trainer = Trainer(model=readme["model_init"](), args=_args(tmp_path),
                      train_dataset=readme["made_up_tokens"](512, 0), callbacks=callbacks)
    trainer.train()
    return trainer


def test_callback_reports_in_steps_and_a_fault_raises_the_alarm_during_training(readme, tmp_path):
    clean = _train(readme, tmp_path, [])
    logged = [(h["step"], h["loss"]) for h in clean.state.log_history if "loss" in h]
    reference = ([s / 30 for s, _ in logged], [y for _, y in logged])  # a clean run: the alarm's reference
    trial = optuna.create_study().ask()
    callback = CollapseCallback(trial, metric="loss", alarm=reference, stop_on_alarm=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        faulty = _train(readme, tmp_path, [callback, _Fault(at=15)])
    watch = callback.watch
    assert watch.alarm is not None and 0.5 < watch.alarm.t_hat < 1.0
    assert faulty.state.global_step == round(watch.alarm.t_hat * 30) < 30  # stopped at the alarm
    assert any(issubclass(w.category, CollapseAlarmWarning) for w in caught)
    stored = trial.study.trials[0]
    assert stored.user_attrs[ALARM_ATTR]["step"] == faulty.state.global_step
    assert (stored.user_attrs["units"], stored.user_attrs["total"]) == ("steps", 30)
    assert sorted(stored.intermediate_values) == [s for s, _ in logged][: len(stored.intermediate_values)]
    assert stored.intermediate_values[1] == pytest.approx(logged[0][1])  # the training loss, at its step


def test_callback_in_your_own_objective_raises_trial_pruned_out_of_train(readme, tmp_path):
    """A finished competitor with the same controls (steps, cosine with its warm-up, τ) and a far lower curve:
    the trial is pruned at its first judgement and ``Trainer.train`` ends with ``optuna.TrialPruned``."""
    study = optuna.create_study(pruner=CollapsePruner(reference="online", min_fraction=0.2))
    attrs = {"units": "steps", "total": 30, "schedule": Schedule(kind="cosine", warmup=0.1).to_dict(),
             "tau": step_tau(3e-3, 0.1, 30), "tpp": None}
    study.add_trial(optuna.trial.create_trial(value=0.5, intermediate_values={s: 0.5 for s in range(1, 31)},
                                              user_attrs=attrs))
    trial = study.ask()
    with pytest.raises(optuna.TrialPruned, match="pruned by the collapse rule"):
        _train(readme, tmp_path, [CollapseCallback(trial)])
    stored = study.trials[1]
    assert {k: stored.user_attrs[k] for k in attrs} == attrs  # equal controls, read from the arguments
    assert 6 <= max(stored.intermediate_values) < 30 and stored.user_attrs["collapse_decisions"][-1]["prune"]


def test_controls_from_the_arguments_of_each_schedule(tmp_path):
    for kind, kw, want in [
        ("linear", {}, {"kind": "linear", "warmup": 0.1}),
        ("constant_with_warmup", {}, {"kind": "constant", "warmup": 0.1}),
        ("constant", {}, {"kind": "constant", "warmup": 0.0}),
        ("cosine_with_min_lr", {"min_lr_rate": 0.1}, {"kind": "cosine", "warmup": 0.1, "final": 0.1}),
        ("warmup_stable_decay", {"num_decay_steps": 6, "decay_type": "linear"},
         {"kind": "wsd", "warmup": 0.1, "decay": 0.2}),
    ]:
        c = controls_from_args(_args(tmp_path, lr_scheduler_type=kind, lr_scheduler_kwargs=kw), 30)
        got = c["schedule"].to_dict()
        assert {k: got[k] for k in want} == pytest.approx(want), kind
        assert c["units"] == "steps" and c["total"] == 30 and c["tpp"] is None
        assert c["tau"] == pytest.approx(1.0 / (3e-3 * 0.1 * 30))
    assert controls_from_args(_args(tmp_path, weight_decay=0.0), 30)["tau"] is None  # no weight decay
    with pytest.raises(InputError, match="no collapse schedule shape"):
        controls_from_args(_args(tmp_path, lr_scheduler_type="polynomial"), 30)
    poly = transformers.get_scheduler("polynomial", torch.optim.SGD([torch.zeros(1)], lr=1.0), 3, 30)
    sampled = controls_from_args(_args(tmp_path, lr_scheduler_type="polynomial"), 30, lr_scheduler=poly)
    assert sampled["schedule"].kind == "data" and math.isclose(float(sampled["schedule"](0.1)), 1.0)


def test_from_the_repository_root_the_shadowed_kernels_package_is_named():
    """From the repository root its kernels/ folder hides the package transformers needs: one clear line
    instead of transformers' "cannot import name ... from 'kernels'"."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", "import collapse_hpo.hpo.integrations.huggingface"], cwd=root,
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "resolves to collapse-hpo's own folder" in out.stderr and "run from another folder" in out.stderr
