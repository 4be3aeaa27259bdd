"""Hugging Face ``Trainer``: a ``TrainerCallback`` and an ``hp_space`` helper for collapse-based pruning.

``CollapseCallback`` reads the run's controls from the ``TrainingArguments`` at the start of training (the
schedule from ``lr_scheduler_type`` and its kwargs, the warm-up from ``warmup_steps``/``warmup_ratio``, the
weight decay, ``max_steps`` and the batch size) and hands them, with the Optuna trial, to a
``TrainingWatch`` (hpo/integrations/loop.py): progress is counted in optimizer steps (``units="steps"``,
``total`` = the run's max steps), τ = 1/(η·λ·steps) (``predictors.timescale.step_tau``), and TPP is computed
only when ``tokens_per_sample`` is given (D = steps × global batch × tokens per sample over the model's
non-embedding parameters), else it is left undefined with a note. At every log it reports the metric
(default the training loss) to the trial and runs the deviation alarm; a pruned trial raises
``optuna.TrialPruned`` out of ``Trainer.train`` (as Hugging Face's own search does), an alarm with
``stop_on_alarm`` ends training (``control.should_training_stop``).

``collapse_hp_space(trainer, space)`` is the ``hp_space`` for
``Trainer.hyperparameter_search(backend="optuna", pruner=CollapsePruner(...))``: it draws ``space(trial)`` and
gives the trial to the trainer's ``CollapseCallback`` (added when missing), which sets the trial's controls
from the final arguments before the first step. In that search Hugging Face reports the objective (the
evaluation loss, at each evaluation step) to the trial itself, so the callback does not report
(``report=False``) and runs the alarm only.

Imports transformers (and torch through it); nothing else of this package does.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import optuna


def _kernels_not_shadowed() -> None:
    """transformers imports the ``kernels`` package; with this repository's root on ``sys.path``
    (``python -c`` or ``python -m pytest`` started there) its ``kernels/`` folder is found instead, and
    transformers fails with an unrelated ImportError. Say what it is."""
    ours, found = importlib.util.find_spec("collapse_hpo.kernels"), importlib.util.find_spec("kernels")
    if ours is None or found is None or not ours.origin or not found.origin:
        return
    if os.path.exists(found.origin) and os.path.samefile(ours.origin, found.origin):
        raise ImportError(
            f"collapse_hpo.hpo.integrations.huggingface: 'kernels' resolves to collapse-hpo's own folder "
            f"{os.path.dirname(found.origin)} (the repository root is on sys.path), which hides the "
            "'kernels' package transformers needs: run from another folder"
        )


_kernels_not_shadowed()
from transformers import TrainerCallback  # noqa: E402

from collapse_hpo.hpo.integrations.loop import TrainingWatch, WatchOptions, sampled_schedule  # noqa: E402
from collapse_hpo.predictors.errors import InputError  # noqa: E402
from collapse_hpo.predictors.residuals import AlarmRule  # noqa: E402
from collapse_hpo.predictors.schedules import Schedule  # noqa: E402
from collapse_hpo.predictors.timescale import no_decay_tau, step_tau, tokens_per_parameter  # noqa: E402

__all__ = ["CollapseCallback", "collapse_hp_space", "controls_from_args", "non_embedding_params"]


def _kind(args: Any) -> str:
    kind = args.lr_scheduler_type
    return str(getattr(kind, "value", kind))


def _named_schedule(args: Any, max_steps: int) -> Schedule | None:
    """The Schedule of a named Hugging Face scheduler with the shape of one of ours, else None."""
    warmup = args.get_warmup_steps(max_steps) if hasattr(args, "get_warmup_steps") else int(args.warmup_steps)
    if not warmup and getattr(args, "warmup_ratio", 0):  # transformers 4: warmup_ratio beside warmup_steps
        warmup = math.ceil(max_steps * float(args.warmup_ratio))
    w = min(float(warmup) / max_steps, 0.999)
    kw = dict(args.lr_scheduler_kwargs or {})
    kind = _kind(args)
    if kind == "linear" and not kw:
        return Schedule(kind="linear", warmup=w)
    if kind == "cosine" and float(kw.get("num_cycles", 0.5)) == 0.5 and set(kw) <= {"num_cycles"}:
        return Schedule(kind="cosine", warmup=w)
    if kind == "cosine_with_min_lr" and set(kw) == {"min_lr_rate"}:
        return Schedule(kind="cosine", warmup=w, final=float(kw["min_lr_rate"]))
    if kind == "constant":
        return Schedule(kind="constant")  # Hugging Face's "constant" has no warm-up
    if kind == "constant_with_warmup":
        return Schedule(kind="constant", warmup=w)
    if (kind == "warmup_stable_decay" and kw.get("decay_type") == "linear"
            and kw.get("warmup_type", "linear") == "linear" and "num_decay_steps" in kw):
        decay = min(float(kw["num_decay_steps"]) / max_steps, 1.0 - w)
        return Schedule(kind="wsd", warmup=w, decay=decay, final=float(kw.get("min_lr_ratio", 0.0)))
    return None


def non_embedding_params(model: Any) -> int:
    """The model's parameters without its input and output embeddings (the N of TPP = D/N)."""
    skip = {id(p) for get in ("get_input_embeddings", "get_output_embeddings")
            for m in [getattr(model, get, lambda: None)()] if m is not None for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def controls_from_args(
    args: Any,
    max_steps: int,
    *,
    model: Any = None,
    lr_scheduler: Any = None,
    tokens_per_sample: int | None = None,
    schedule: Schedule | str | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``TrainingWatch`` controls of a Hugging Face run: units "steps", total ``max_steps``, the schedule,
    τ = 1/(η·λ·steps) and the TPP (None without ``tokens_per_sample``).

    The schedule is ``schedule`` when given, else the named shape of ``args.lr_scheduler_type`` (linear,
    cosine, cosine_with_min_lr, constant, constant_with_warmup, warmup_stable_decay with linear decay), else
    the run's own ``lr_scheduler`` sampled at 200 points (kind "data"). Raises InputError when none applies.
    """
    if not isinstance(max_steps, int) or max_steps <= 0:
        raise InputError(f"Hugging Face run: max_steps must be a positive number of optimizer steps, got "
                         f"{max_steps!r}")
    if schedule is None:
        schedule = _named_schedule(args, max_steps)
    if schedule is None and lr_scheduler is not None and hasattr(lr_scheduler, "lr_lambdas"):
        schedule = sampled_schedule(lr_scheduler.lr_lambdas[0], max_steps)
    if schedule is None:
        raise InputError(f"Hugging Face run: lr_scheduler_type {_kind(args)!r} with kwargs "
                         f"{dict(args.lr_scheduler_kwargs or {})} has no collapse schedule shape and no "
                         "LambdaLR to sample: give schedule=Schedule(...)")
    tau = no_decay_tau(step_tau(args.learning_rate, args.weight_decay, max_steps))
    tpp = None
    if tokens_per_sample is not None:
        if model is None:
            raise InputError("Hugging Face run: tokens_per_sample needs the model, to count its parameters")
        per_step = args.train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        tpp = tokens_per_parameter(max_steps * per_step * tokens_per_sample, non_embedding_params(model))
    return {"units": "steps", "total": max_steps, "schedule": schedule, "tau": tau, "tpp": tpp}


class CollapseCallback(TrainerCallback):
    """Collapse pruning and the deviation alarm inside a Hugging Face ``Trainer``.

    Args:
        trial: the Optuna trial of this run (your own objective); None inside
            ``Trainer.hyperparameter_search``, where ``collapse_hp_space`` hands each trial over.
        metric: the logged key to report and to watch: "loss" (training loss, the default) or "eval_loss".
        alarm: the deviation alarm's reference (a ``Surrogate``, a surrogate JSON path, or a clean run's
            (t̂, loss) pair), or None (no alarm).
        alarm_rule: its ``AlarmRule`` (default: ``collapse-hpo monitor``'s).
        stop_on_alarm: end training when the alarm fires (default: warn and record it only).
        report: report ``metric`` to the trial; default True with a ``trial``, False when the trial comes from
            ``collapse_hp_space`` (Hugging Face's search reports its objective itself).
        tokens_per_sample: tokens in one training sample (the sequence length), to compute TPP; None: TPP is
            not defined (said in the trial's ``collapse_notes``, never guessed).
        schedule: the LR schedule shape, when ``lr_scheduler_type`` has none of ours (see
            ``controls_from_args``).

    After training, ``watch`` holds the run's ``TrainingWatch`` (``alarm``, ``pruned``, ``stop_reason``).
    """

    def __init__(
        self,
        trial: Any = None,
        *,
        metric: str = "loss",
        alarm: Any = None,
        alarm_rule: AlarmRule | None = None,
        stop_on_alarm: bool = False,
        report: bool | None = None,
        tokens_per_sample: int | None = None,
        schedule: Schedule | str | Mapping[str, Any] | None = None,
    ) -> None:
        self.trial = trial
        self.search_trial: Any = None  # set by collapse_hp_space for each trial of a search
        self.metric = metric
        self.report = report
        self.options = WatchOptions(alarm, alarm_rule, stop_on_alarm, tokens_per_sample, schedule)
        self.watch: TrainingWatch | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, lr_scheduler: Any = None,
                       **kwargs: Any) -> None:
        trial = self.trial if self.trial is not None else self.search_trial
        report = self.report if self.report is not None else self.trial is not None
        opts = self.options
        controls = controls_from_args(args, int(state.max_steps), model=model, lr_scheduler=lr_scheduler,
                                      tokens_per_sample=opts.tokens_per_sample, schedule=opts.schedule)
        self.watch = opts.start(trial, controls, report=report)

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, float] | None = None,
               **kwargs: Any) -> None:
        if self.watch is None or not logs or self.metric not in logs:
            return
        if self.watch.report(state.global_step, float(logs[self.metric])):
            if self.watch.pruned:
                raise optuna.TrialPruned(self.watch.stop_reason)
            control.should_training_stop = True


def collapse_hp_space(
    trainer: Any, space: Callable[[Any], Mapping[str, Any]] | None = None, **callback_options: Any
) -> Callable[[Any], dict[str, Any]]:
    """The ``hp_space`` for ``trainer.hyperparameter_search(backend="optuna", ...)``: draws ``space(trial)``
    (default: Hugging Face's own optuna space) and gives the trial to the trainer's ``CollapseCallback``
    (added with ``callback_options`` when the trainer has none), which sets the trial's controls (units
    "steps", total, schedule, τ, TPP) from the final ``TrainingArguments`` when training starts."""
    callback = next((c for c in trainer.callback_handler.callbacks if isinstance(c, CollapseCallback)), None)
    if callback is None:
        callback = CollapseCallback(**callback_options)
        trainer.add_callback(callback)
    elif callback_options:
        raise InputError("collapse_hp_space: the trainer has a CollapseCallback already: give it the options")
    if space is None:
        from transformers.trainer_utils import default_hp_space_optuna

        space = default_hp_space_optuna

    def hp_space(trial: Any) -> dict[str, Any]:
        params = dict(space(trial))
        callback.search_trial = trial
        return params

    return hp_space
