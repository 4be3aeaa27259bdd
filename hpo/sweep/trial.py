"""The one trial function: it joins the Optuna study, the trainer and Ray Tune.

The driver asks the study for a trial (so the sampler runs once, seeded, in one process) and hands Ray Tune a
config naming the storage, the study and the trial number. On a Ray worker, `trial_function`:

1. opens the study in the storage and the trial by its number (``optuna.trial.Trial(study, trial_id)``);
2. derives λ from the held τ (`collapse_hpo.hpo.sweep.space`), builds a `TrainConfig` and writes the trial's
   controls as user attrs (params, weight_decay, tau, tpp, total_tokens, schedule, seed, params);
3. trains; every `Report` records an Optuna heartbeat, goes to Optuna (``trial.report(loss, tokens)`` then
   ``trial.should_prune()``) and to Ray Tune (``ray.tune.report``);
4. ends the trial itself: PRUNED (the pruner has written the predicted final loss), COMPLETE with the final
   loss, or FAIL with the error recorded (``error``, ``traceback`` user attrs). It never raises for a failed
   run, so the sweep goes on; a worker that dies outright is failed by the driver (`hpo.sweep.runner`).

`run_trial` is the same function without Ray (``tune_report=None``), for tests and plain scripts.
"""

from __future__ import annotations

import contextlib
import math
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_hpo.hpo.extras import install_hint, missing
from collapse_hpo.hpo.sweep import storage_errors
from collapse_hpo.hpo.sweep.config import SweepConfig
from collapse_hpo.hpo.sweep.space import space_for_sweep
from collapse_hpo.hpo.sweep.urls import mask_text, mask_url, resolve_url
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.trainers.config import FaultConfig, TrainConfig, plan

if TYPE_CHECKING:
    import optuna

# Keys of the Ray Tune trial config the driver builds (see `trial_config`).
CONFIG_KEYS = ("sweep", "storage", "study", "number", "prune", "results")
# User attr with the id of the Ray node that ran the trial (see `_record_ray_node`).
RAY_NODE_ATTR = "ray_node_id"
# Key of the Ray Tune result by which a worker tells the driver that the storage failed (a full disk, a
# damaged database: hpo/sweep/storage_errors.py); the driver then stops the sweep, charging no trial an
# attempt.
STORAGE_FAULT_KEY = "storage_fault"


def trial_config(sweep: SweepConfig, storage_url: str, study_name: str, number: int, prune: bool,
                 results_dir: str | Path) -> dict[str, Any]:
    """The config of one Ray Tune trial: everything a worker needs to run Optuna trial ``number``."""
    return {"sweep": sweep.to_jsonable(), "storage": storage_url, "study": study_name, "number": int(number),
            "prune": bool(prune), "results": str(results_dir)}


def storage_url(url: str) -> str:
    """``url`` (a ``${NAME}`` URL read from the environment) with a database driver SQLAlchemy can load. A
    plain ``postgresql://`` names no driver: SQLAlchemy 2.1 loads psycopg 3 for it (the ``postgres`` extra),
    2.0 loads psycopg2; so it names whichever of the two is installed when the other is not."""
    import importlib.util

    url = resolve_url(url, "storage")
    if url.startswith("postgresql") and missing("psycopg", "psycopg2") == ["psycopg", "psycopg2"]:
        raise InputError(f"storage {mask_url(url)}: PostgreSQL needs a driver, and none is installed: "
                         f"{install_hint(['psycopg'])}")
    if url.startswith("postgresql://"):
        has_psycopg = importlib.util.find_spec("psycopg") is not None
        has_psycopg2 = importlib.util.find_spec("psycopg2") is not None
        if has_psycopg and not has_psycopg2:
            return "postgresql+psycopg://" + url[len("postgresql://"):]
        if has_psycopg2 and not has_psycopg:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def open_storage(url: str, sweep: SweepConfig) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage with the sweep's heartbeat settings (SQLite with a long lock timeout)."""
    import warnings

    import optuna

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            storage_url(url), heartbeat_interval=sweep.heartbeat.interval, grace_period=sweep.heartbeat.grace,
            **kwargs
        )


def build_pruner(sweep: SweepConfig, prune: bool) -> optuna.pruners.BasePruner:
    """The sweep's pruner: the `CollapsePruner` with its reference and settings, or NopPruner when off."""
    import optuna

    if not (prune and sweep.pruner.enabled):
        return optuna.pruners.NopPruner()
    from collapse_hpo.hpo.optuna_side.pruner import (
        CollapsePruner,  # deferred: pulls optuna; this module loads it only when used
    )

    p = sweep.pruner
    return CollapsePruner(reference=p.reference.spec(sweep.base_dir()), settings=p.rule_settings(),
                          report_prediction=p.report_prediction, judge_every=p.judge_every)


def injected_fault(sweep: SweepConfig, draw: int, attempt: int) -> Any:
    """The sweep's `FaultSpec` for this (draw, attempt), or None (the normal case)."""
    for f in sweep.faults:
        if draw in f.draws and attempt in f.attempts:
            return f
    return None


def report_drills(fault: Any) -> list[Callable[[Any], None]]:
    """The reporter hooks of a sweep's fault drill (``kill_worker``: the worker dies outright); [] without."""
    if fault is None or fault.kind != "kill_worker":
        return []
    from collapse_hpo.trainers.fault import KillWorker  # deferred: pulls torch (train extra)

    return [KillWorker(fault.start_t_hat)]


def train_config(sweep: SweepConfig, params: dict[str, Any], seed: int,
                 fault: Any = None) -> tuple[TrainConfig, dict[str, Any]]:
    """The `TrainConfig` of a trial with sampled ``params`` and training ``seed``, and its derived
    hyperparameters (lr, batch_tokens, weight_decay λ, tau τ, total_tokens D, tpp, schedule, ...)."""
    space = space_for_sweep(sweep)
    hp = space.derive(params)
    sched = Schedule.parse(sweep.schedule)
    sched_fields = {k: float(hp[k]) for k in ("warmup", "decay", "final") if k in hp}
    if sched_fields:
        sched = Schedule.from_dict({**sched.to_dict(), **sched_fields, "kind": sched.kind})
    m = sweep.model
    t = sweep.train
    shape: dict[str, Any] = {"width": int(hp.get("width", m.width)), "depth": int(hp.get("depth", m.depth)),
                             "heads": m.heads, "context": m.context}
    shape["base_width"] = m.base_width or m.width
    shape["base_depth"] = m.base_depth or m.depth
    budget: dict[str, Any] = {"total_tokens": int(sweep.total_tokens or 0)}
    if sweep.tpp is not None:
        budget = {"tpp": float(sweep.tpp)}
    decay: dict[str, Any] = {}
    held = space.tau is not None or "tau" in sweep.space or "tau" in sweep.fixed
    if held:
        decay["tau"] = float(hp["tau"])  # the trainer derives λ = B/(ητD) with its exact D
    elif hp["weight_decay"]:
        decay["weight_decay"] = float(hp["weight_decay"])
    extra: dict[str, Any] = {}
    for name in ("micro_batch_tokens", "report_every_tokens", "threads"):
        if getattr(t, name) is not None:
            extra[name] = getattr(t, name)
    if t.val_fractions is not None:
        extra["val_fractions"] = tuple(t.val_fractions)
    if fault is not None and fault.kind != "kill_worker":
        extra["fault"] = FaultConfig(acknowledge=fault.acknowledge, kind=fault.kind,
                                     start_t_hat=fault.start_t_hat)
    config = TrainConfig(**shape, **budget, batch_tokens=int(hp["batch_tokens"]), lr=float(hp["lr"]),
                         schedule=sched, seed=int(seed), device=t.device, dtype=t.dtype, compile=t.compile,
                         corpus=_corpus(sweep), **decay, **extra)
    p = plan(config)
    derived = {
        "lr": float(hp["lr"]), "batch_tokens": int(hp["batch_tokens"]), "weight_decay": p.weight_decay,
        # A sweep that gives total_tokens has no TPP (fine-tuning): the record says "not defined" (None).
        "tau": p.tau, "total_tokens": p.total_tokens, "tpp": p.tpp if sweep.tpp is not None else None,
        "schedule": sched.to_dict(), "warmup": sched.warmup, "seed": int(seed),
        "params_non_embedding": p.params_non_embedding, "width": shape["width"], "depth": shape["depth"],
    }
    return config, derived


def _corpus(sweep: SweepConfig) -> str:
    c = sweep.train.corpus
    if c == "stdlib":
        return c
    p = Path(c).expanduser()
    return str(p if p.is_absolute() else sweep.base_dir() / p)


class _Heartbeat:
    """Records an Optuna heartbeat for a trial every ``interval`` seconds (daemon thread) and on demand."""

    def __init__(self, storage: Any, trial_id: int, interval: float) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"heartbeat-{trial_id}")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def beat(self) -> None:
        # A missed heartbeat only risks a stale mark later; never crash training for it.
        with contextlib.suppress(Exception):
            self.storage.record_heartbeat(self.trial_id)

    def __enter__(self) -> _Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_trial(config: dict[str, Any], tune_report: Callable[[dict[str, Any]], None] | None = None) -> str:
    """Train Optuna trial ``config["number"]`` and end it; returns its final state name.

    ``config`` is `trial_config`'s dict. ``tune_report`` receives one metrics dict per `Report` (``loss``,
    ``t_hat``, ``tokens``, ``lr``, ``val_loss``, ``number``). Returns "COMPLETE", "PRUNED", "FAIL",
    "STORAGE_FAULT" (the storage failed under it: told to Tune under `STORAGE_FAULT_KEY`, the trial marked
    interrupted), or the state the trial already had when it was not RUNNING (nothing is trained then).
    """
    import optuna

    from collapse_hpo.trainers.train import train  # deferred: pulls torch (train extra)

    storage_errors.watch()
    sweep = SweepConfig.model_validate(config["sweep"])
    storage = open_storage(config["storage"], sweep)
    study = optuna.load_study(study_name=config["study"], storage=storage,
                              pruner=build_pruner(sweep, bool(config["prune"])))
    number = int(config["number"])
    study_id = storage.get_study_id_from_name(config["study"])
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    frozen = storage.get_trial(trial_id)
    if frozen.state != optuna.trial.TrialState.RUNNING:
        return frozen.state.name
    trial = optuna.trial.Trial(study, trial_id)
    seen: dict[str, Any] = {"tokens": 0, "loss": math.nan}
    try:
        with _Heartbeat(storage, trial_id, sweep.heartbeat.interval) as heartbeat:
            seed = int(frozen.user_attrs.get("seed", 0))
            fault = injected_fault(sweep, int(frozen.user_attrs.get("draw", number)),
                                   int(frozen.user_attrs.get("attempt", 0)))
            train_cfg, derived = train_config(sweep, dict(frozen.params), seed, fault)
            if fault is not None:
                trial.set_user_attr("fault", fault.kind)
            for key, value in derived.items():
                trial.set_user_attr(key, value)
            _record_ray_node(trial)
            drills = report_drills(fault)

            def reporter(r: Any) -> None:
                heartbeat.beat()
                tokens = int(r.tokens)
                seen["tokens"] = max(seen["tokens"], tokens)
                loss = float(r.loss)
                seen["loss"] = loss
                trial.report(loss, tokens)
                if tune_report is not None:
                    tune_report({"loss": loss, "t_hat": float(r.t_hat), "tokens": tokens, "lr": float(r.lr),
                                 "val_loss": None if r.val_loss is None else float(r.val_loss),
                                 "number": number})
                for drill in drills:  # fault drills (sweep YAML ``faults``); none in a normal sweep
                    drill(r)
                # The last report is the end of training: nothing is saved by pruning there.
                if float(r.t_hat) < 1.0 - 1e-9 and trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at {tokens} tokens")

            try:
                result = train(train_cfg, reporter)
            except optuna.TrialPruned:
                trial.set_user_attr("tokens_trained", seen["tokens"])
                study.tell(number, state=optuna.trial.TrialState.PRUNED)
                return "PRUNED"
            final = float(result.final_loss)
            trial.set_user_attr("tokens_trained", int(derived["total_tokens"]))
            trial.set_user_attr("final_loss", final if math.isfinite(final) else None)
            vals = [float(r.val_loss) for r in result.curve if r.val_loss is not None]
            if vals and math.isfinite(vals[-1]):
                trial.set_user_attr("final_val_loss", vals[-1])
            if not math.isfinite(final):
                trial.set_user_attr("error", f"final loss is {final} (the run diverged)")
                study.tell(number, state=optuna.trial.TrialState.FAIL)
                return "FAIL"
            study.tell(number, final)
            return "COMPLETE"
    except Exception as err:
        fault = storage_errors.find_fault(err)
        if fault is None:
            try:
                _record_failure(study, number, trial_id, storage, err, seen["tokens"])
                return "FAIL"
            except Exception as again:  # the failure cannot be recorded: a full disk, a damaged file?
                fault = storage_errors.find_fault(again)
                if fault is None:
                    raise
        _interrupt_for_fault(storage, trial_id, fault)
        if tune_report is not None:
            tune_report({"loss": seen["loss"], "tokens": seen["tokens"], "number": number,
                         STORAGE_FAULT_KEY: str(fault)})
        return "STORAGE_FAULT"


def _interrupt_for_fault(storage: Any, trial_id: int, fault: Exception) -> None:
    """End a trial the storage failed under as FAIL ``interrupted`` (no attempt charged: the trial did nothing
    wrong), when the storage still takes the writes; else it stays RUNNING for the driver (or `resume`) to
    mark the same way."""
    import optuna

    with contextlib.suppress(Exception):
        storage.set_trial_user_attr(trial_id, "interrupted", True)
        storage.set_trial_user_attr(trial_id, "error", f"storage fault: {fault}")
        storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL)


def _record_ray_node(trial: optuna.Trial) -> None:
    """Write the id of the Ray node this trial process runs on (user attr ``ray_node_id``), so a sweep on a
    cluster shows which machine trained each trial. Nothing is written outside Ray (`run_trial` alone)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        trial.set_user_attr(RAY_NODE_ATTR, ray.get_runtime_context().get_node_id())


def _record_failure(study: Any, number: int, trial_id: int, storage: Any, err: BaseException,
                    tokens: int) -> None:
    """Write the error (type, message, traceback, tokens trained) to the trial and end it FAIL."""
    import optuna

    first = (str(err).strip().splitlines() or [""])[0][:500]
    try:
        if storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING:
            return
        # Masked: a storage error can quote the URL, and the study is read by anyone with the dashboard.
        storage.set_trial_user_attr(trial_id, "error", mask_text(f"{type(err).__name__}: {first}"))
        storage.set_trial_user_attr(trial_id, "traceback", mask_text(traceback.format_exc()[-4000:]))
        storage.set_trial_user_attr(trial_id, "tokens_trained", int(tokens))
        study.tell(number, state=optuna.trial.TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def trial_function(config: dict[str, Any]) -> None:
    """The Ray Tune function trainable: `run_trial` reporting each `Report` with ``ray.tune.report``."""
    from ray import tune

    last: dict[str, Any] = {"loss": math.nan}

    def report(metrics: dict[str, Any]) -> None:
        last.update(metrics)
        tune.report(metrics)

    state = run_trial(config, tune_report=report)
    tune.report({**last, "state": state, "number": int(config["number"])})
