"""PyTorch Lightning: ``CollapseLightningCallback``, collapse pruning and the deviation alarm in ``fit``.

At the start of training it reads the run's controls from the Lightning ``Trainer``: progress in optimizer
steps (``units="steps"``, ``total`` = ``max_steps``, else ``estimated_stepping_batches``), the peak LR and
AdamW weight decay from the optimizer (the param group with the largest weight decay: the hidden matrices),
τ = 1/(η·λ·steps) (``predictors.timescale.step_tau``), the schedule from the configured LR scheduler (a
``LambdaLR`` is sampled; none is a constant LR; any other needs ``schedule=``) and TPP only from
``tokens_per_sample`` (D = steps × batch size × accumulation × devices × tokens per sample over the module's
non-embedding parameters), else undefined with a note. After each optimizer step it hands the loss to a
``TrainingWatch`` (hpo/integrations/loop.py): reported to the Optuna trial (pruned: ``optuna.TrialPruned`` is
raised out of ``fit``) and checked by the deviation alarm (fired with ``stop_on_alarm``:
``trainer.should_stop``).

Imports lightning (and torch through it); nothing else of this package does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from lightning.pytorch.callbacks import Callback

from collapse_hpo.hpo.integrations.loop import TrainingWatch, WatchOptions, sampled_schedule
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.residuals import AlarmRule
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.timescale import no_decay_tau, step_tau, tokens_per_parameter

__all__ = ["CollapseLightningCallback", "controls_from_trainer"]


def _non_embedding_params(module: Any) -> int:
    import torch

    skip = {id(p) for m in module.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in module.parameters() if id(p) not in skip)


def controls_from_trainer(
    trainer: Any,
    module: Any,
    *,
    schedule: Schedule | str | Mapping[str, Any] | None = None,
    tokens_per_sample: int | None = None,
) -> dict[str, Any]:
    """The ``TrainingWatch`` controls of a Lightning run (call once the optimizers exist: ``on_train_start``).

    Raises InputError naming what is missing (no optimizer, no known number of steps, a scheduler with no
    shape this can read).
    """
    steps = trainer.max_steps
    if not steps or steps <= 0:
        steps = trainer.estimated_stepping_batches
    if not isinstance(steps, int | float) or not 0 < steps < float("inf"):
        raise InputError(f"Lightning run: its number of optimizer steps is unknown ({steps!r}): "
                         "give max_steps")
    steps = int(steps)
    if not trainer.optimizers:
        raise InputError("Lightning run: the module configured no optimizer")
    groups = trainer.optimizers[0].param_groups
    group = max(groups, key=lambda g: float(g.get("weight_decay", 0.0)))
    lr = float(group.get("initial_lr", group["lr"]))
    tau = no_decay_tau(step_tau(lr, float(group.get("weight_decay", 0.0)), steps))
    if schedule is None:
        configs = list(getattr(trainer, "lr_scheduler_configs", []) or [])
        if not configs:
            schedule = Schedule(kind="constant")
        elif hasattr(configs[0].scheduler, "lr_lambdas"):
            schedule = sampled_schedule(configs[0].scheduler.lr_lambdas[0], steps)
        else:
            name = type(configs[0].scheduler).__name__
            raise InputError(f"Lightning run: cannot read the shape of {name}: give schedule=Schedule(...) "
                             "(or use a LambdaLR)")
    tpp = None
    if tokens_per_sample is not None:
        batch = getattr(trainer.train_dataloader, "batch_size", None)
        if not batch:
            raise InputError("Lightning run: tokens_per_sample needs the train dataloader's batch_size")
        per_step = batch * trainer.accumulate_grad_batches * max(1, trainer.world_size)
        tpp = tokens_per_parameter(steps * per_step * tokens_per_sample, _non_embedding_params(module))
    return {"units": "steps", "total": steps, "schedule": schedule, "tau": tau, "tpp": tpp}


class CollapseLightningCallback(Callback):
    """Collapse pruning and the deviation alarm inside ``lightning.pytorch.Trainer.fit``.

    Args:
        trial: the Optuna trial of this run, or None (the alarm only).
        metric: the loss to watch: a key of ``trainer.callback_metrics`` (what ``self.log`` logged) or, when
            absent, the ``loss`` that ``training_step`` returned (default "loss").
        alarm: the deviation alarm's reference (a ``Surrogate``, a surrogate JSON path, or a clean run's
            (t̂, loss) pair, e.g. an earlier run's ``callback.watch.curve``), or None (no alarm).
        alarm_rule: its ``AlarmRule`` (default: ``collapse-hpo monitor``'s).
        stop_on_alarm: stop training when the alarm fires (default: warn and record it only).
        report: report the loss to the trial (default True with a trial).
        schedule: the LR schedule shape when the configured scheduler is no ``LambdaLR``.
        tokens_per_sample: tokens in one training sample, to compute TPP; None: TPP is not defined (said in
            the trial's ``collapse_notes``, never guessed).

    After training, ``watch`` holds the run's ``TrainingWatch`` (``alarm``, ``pruned``, ``curve``).
    """

    def __init__(
        self,
        trial: Any = None,
        *,
        metric: str = "loss",
        alarm: Any = None,
        alarm_rule: AlarmRule | None = None,
        stop_on_alarm: bool = False,
        report: bool = True,
        schedule: Schedule | str | Mapping[str, Any] | None = None,
        tokens_per_sample: int | None = None,
    ) -> None:
        self.trial = trial
        self.metric = metric
        self.report = report
        self.options = WatchOptions(alarm, alarm_rule, stop_on_alarm, tokens_per_sample, schedule)
        self.watch: TrainingWatch | None = None
        self._last_step = -1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        controls = controls_from_trainer(trainer, pl_module, schedule=self.options.schedule,
                                         tokens_per_sample=self.options.tokens_per_sample)
        self.watch = self.options.start(self.trial, controls, report=self.report)
        self._last_step = -1

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        if self.watch is None or step == self._last_step or step == 0:
            return  # within a gradient accumulation: no optimizer step yet
        value = trainer.callback_metrics.get(self.metric)
        if value is None and isinstance(outputs, Mapping):
            value = outputs.get(self.metric)
        if value is None:
            return
        self._last_step = step
        if self.watch.report(step, float(value)):
            if self.watch.pruned:
                raise optuna.TrialPruned(self.watch.stop_reason)
            trainer.should_stop = True
