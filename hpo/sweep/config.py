"""The sweep file: a YAML document validated into a `SweepConfig` (pydantic).

A sweep holds the fixed controls of every trial (model shape, TPP or token budget, LR schedule, the AdamW
timescale τ to hold), the search space (Optuna distributions over ``lr``, ``batch_tokens``, ``warmup``, ...;
λ = ``weight_decay`` is derived from τ, never searched when τ is held), how many trials and training seeds,
the sampler, the pruner, resources per trial, the Ray executor, the Optuna storage, retries and the results
folder.

A sweep gives exactly one of ``tpp`` (tokens per parameter: D = tpp · N) and ``total_tokens`` (D itself). With
``total_tokens`` the TPP is not defined, as in a fine-tuning sweep: its trials record ``tpp`` None, the
surrogate's q(TPP) is a constant, and ``tau: optimal`` (optimal_tau(tpp), the default) is refused: give τ as
a number, ``null`` or ``weight_decay``.

Every error is one line that names the file, the field and what is allowed (`InputError`); loading a file
never creates anything. Example::

    name: quickstart
    model: {width: 48, depth: 2, heads: 2}
    tpp: 20                      # or total_tokens: 2000000 (TPP not defined; tau must then be given)
    schedule: {kind: linear, warmup: 0.05}
    tau: optimal                 # or a number; null = no weight decay
    fixed: {batch_tokens: 2048}
    space:
      lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}
    trials: 12
    sampler: {name: qmc, seed: 0}
    pruner: {enabled: true, min_fraction: 0.2, reference: {online: true, min_trials: 2}}

A sweep may have ``stages:`` (multi-fidelity across sizes, `StageSpec`): stage 1 sweeps the space at a small
``width``; stage 2 takes stage 1's ``top_k`` settings to the target shape (``model``). See
hpo/sweep/stages.py.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from collapse_hpo.hpo.rule.decision import PruneSettings, SettingError
from collapse_hpo.hpo.rule.judge import DEFAULT_JUDGE_EVERY, Judge
from collapse_hpo.hpo.rule.reference import near_online
from collapse_hpo.hpo.sweep.urls import (
    REFERENCE_STORAGE_ENV,
    STORAGE_ENV,
    env_name,
    resolve_url,
    sqlite_url,
    url_problem,
)
from collapse_hpo.predictors.errors import EXCERPT_CHARS, InputError, clip, excerpt
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.timescale import check_one_decay
from collapse_hpo.trainers.config import FAULT_ACKNOWLEDGEMENT

# Upper bounds of counts and sizes: beyond these a sweep is a typo (1e21 trials), not a plan.
MAX_TRIALS = 100_000
MAX_SEEDS = 1_000
MAX_RETRIES = 100
MAX_NAME = 100
MAX_TPP = 1e6
MAX_TOKENS = 10**15
MAX_MODEL_DIM = 1 << 20
# A sweep file is a few hundred bytes and a few hundred YAML nodes. Beyond these bounds it is not a sweep: a
# bigger file is refused before it is read, and a document whose aliases (``*name`` repeats the content of
# ``&name``) expand to more nodes is refused before anything is built from it (an "alias bomb" of 1 KB expands
# to 43 million nodes).
MAX_SWEEP_BYTES = 1 << 20
MAX_YAML_NODES = 50_000

# Hyperparameters a trial takes, searched (``space``) or fixed (``fixed``). ``decay`` and ``final`` are
# schedule fields (wsd decay fraction, end LR / peak); ``warmup`` overrides the schedule's warmup; ``width``
# and ``depth`` override the model shape (a calibration family: several sizes at one TPP; D = tpp · N each).
HYPERPARAMETERS = ("lr", "batch_tokens", "warmup", "decay", "final", "tau", "weight_decay", "width", "depth")
SAMPLERS = ("random", "qmc", "grid", "tpe")
# Samplers whose draws do not depend on results: the whole plan is drawn up front (seeded) and stored in the
# study, so a pruned and an unpruned sweep (and a resumed one) train exactly the same trials.
PLANNED_SAMPLERS = ("random", "qmc", "grid")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """Model shape (CompleteP): ``width`` (d_model), ``depth`` (layers), ``heads``; base shape for scaling."""

    width: int = Field(gt=0, le=MAX_MODEL_DIM)
    depth: int = Field(gt=0, le=MAX_MODEL_DIM)
    heads: int = Field(gt=0, le=MAX_MODEL_DIM)
    base_width: int | None = Field(default=None, gt=0, le=MAX_MODEL_DIM)
    base_depth: int | None = Field(default=None, gt=0, le=MAX_MODEL_DIM)
    context: int = Field(default=128, gt=0, le=MAX_MODEL_DIM)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads {self.heads}")
        return self


class Distribution(_Strict):
    """An Optuna distribution: ``float`` / ``int`` (low, high, log, step) or ``categorical`` (choices)."""

    type: Literal["float", "int", "categorical"]
    low: float | None = Field(default=None, allow_inf_nan=False)
    high: float | None = Field(default=None, allow_inf_nan=False)
    log: bool = False
    step: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    choices: list[float | int | str | bool] | None = Field(default=None, max_length=MAX_TRIALS)

    @model_validator(mode="after")
    def _consistent(self) -> Distribution:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical distribution needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None:
                raise ValueError("a categorical distribution takes 'choices', not low/high")
            return self
        if self.choices is not None:
            raise ValueError(f"a {self.type} distribution takes low/high, not 'choices'")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} distribution needs both 'low' and 'high'")
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low > self.high:
            raise ValueError(f"needs finite low <= high, got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log=true needs low > 0, got low={self.low}")
        if self.log and self.step is not None:
            raise ValueError("log=true and step cannot be combined")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError("an int distribution needs integer low and high")
        if self.step is not None and (self.high - self.low) / self.step > MAX_TRIALS:
            raise ValueError(f"more than {MAX_TRIALS} steps from low to high; use a larger step")
        return self

    def to_optuna(self) -> Any:
        """The `optuna.distributions.BaseDistribution` this describes (imports optuna)."""
        from optuna import distributions as d

        if self.type == "categorical":
            return d.CategoricalDistribution(list(self.choices or []))
        if self.type == "int":
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return d.FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def bounds(self) -> tuple[float, float] | None:
        """(low, high) of a numeric distribution; None for categorical."""
        if self.type == "categorical":
            return None
        return float(self.low), float(self.high)  # type: ignore[arg-type]

    def values(self) -> list[Any]:
        """All values a grid sampler visits: the choices, or every step of an int/stepped float range."""
        if self.type == "categorical":
            return list(self.choices or [])
        if self.type == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            raise ValueError("the grid sampler needs categorical, int or stepped float distributions")
        n = round((float(self.high) - float(self.low)) / self.step)
        return [float(self.low) + i * self.step for i in range(n + 1)]


class ReferenceSpec(_Strict):
    """Where the pruner gets the collapsed reference curve (the calibrated surrogate); exactly one of:

    - ``surrogate: PATH``: a calibrated surrogate JSON file (``collapse-hpo calibrate``), relative to the
      sweep file.
    - ``study: NAME`` with ``storage: URL``: another Optuna study (a calibration family).
    - ``online: true``: calibrate on this sweep's own first ``min_trials`` completed trials, refit (in the
      background) as more finish (at most ``max_trials`` of them). Until then, and until a fit's error model
      stands on 10 held-out runs (``decision.MARGIN_CAP_RUNS``), the ``prior`` speaks:
      ``builtin`` (default), a surrogate JSON path (relative to the sweep file) or ``none``; it is tested on
      the sweep's own curves and its interval widens by their misses (predictors/prior.py). ``refit``:
      ``background`` (default: a judgement never waits for a fit, and which fit it uses depends on timing)
      or ``inline`` (the fit runs in the judgement that first sees the new set of completed trials: seconds
      of waiting, and every decision a function of the trials alone, e.g. a resumed one-worker sweep decides
      exactly as the uninterrupted one). ``refit_growth`` (≥ 1, default 1.5): the refit schedule, a fit each
      time the count of completed trials reaches 3, 4, 6, 9, 13, ... (1: on every completion); while the
      prior serves, none before 10 (a fit on fewer is thin: the prior would serve anyway).
    Same keys as `collapse_hpo.hpo.rule.reference.make_reference`.
    """

    surrogate: str | None = None
    study: str | None = None
    storage: str | None = None
    online: bool | None = None
    min_trials: int | None = Field(default=None, ge=2, le=MAX_TRIALS)
    max_trials: int | None = Field(default=None, ge=2, le=MAX_TRIALS)
    prior: str | None = None
    refit: Literal["background", "inline"] | None = None
    refit_growth: float | None = Field(default=None, ge=1.0, le=100.0)

    @model_validator(mode="after")
    def _one(self) -> ReferenceSpec:
        kinds = [k for k in ("surrogate", "study", "online") if getattr(self, k) not in (None, False)]
        if len(kinds) != 1:
            raise ValueError(
                "give exactly one of 'surrogate: PATH', 'study: NAME' (with 'storage') or 'online: true'"
            )
        if self.study and not self.storage and not os.environ.get(REFERENCE_STORAGE_ENV):
            raise ValueError("a 'study' reference needs 'storage' (the Optuna storage URL of that study, or "
                             f"${{NAME}} to read it from the environment), or {REFERENCE_STORAGE_ENV} set")
        if self.storage and not self.study:
            raise ValueError("'storage' belongs to a 'study' reference; add 'study: NAME'")
        if self.max_trials is not None and self.kind != "online":
            raise ValueError("'max_trials' belongs to an 'online: true' reference")
        if self.prior is not None and self.kind != "online":
            raise ValueError("'prior' belongs to an 'online: true' reference")
        if self.refit is not None and self.kind != "online":
            raise ValueError("'refit' belongs to an 'online: true' reference")
        if self.refit_growth is not None and self.kind != "online":
            raise ValueError("'refit_growth' belongs to an 'online: true' reference")
        if self.min_trials is not None and self.kind == "surrogate":
            raise ValueError("'min_trials' does not apply to a 'surrogate' reference")
        if self.max_trials is not None and self.min_trials is not None and self.max_trials < self.min_trials:
            raise ValueError(f"max_trials ({self.max_trials}) must be >= min_trials ({self.min_trials})")
        if self.storage is not None and env_name(self.storage) is None:
            problem = url_problem(self.storage)
            if problem:
                raise ValueError(problem)
        return self

    @property
    def storage_ref(self) -> str | None:
        """The reference storage as written (a URL or ``${NAME}``); ``${COLLAPSE_HPO_REFERENCE_STORAGE}``
        for a study reference without one. Resolve it with `collapse_hpo.hpo.sweep.urls.resolve_url`."""
        if self.storage is None and self.study:
            return "${" + REFERENCE_STORAGE_ENV + "}"
        return self.storage

    @property
    def kind(self) -> str:
        """``surrogate``, ``study`` or ``online``."""
        if self.surrogate:
            return "surrogate"
        return "study" if self.study else "online"

    def spec(self, base_dir: Path) -> dict[str, Any]:
        """The mapping `make_reference` takes; a relative surrogate path is resolved against ``base_dir``, a
        ``${NAME}`` storage read from the environment (the result holds the real URL: never persist it)."""
        if self.kind == "surrogate":
            p = Path(os.path.expanduser(str(self.surrogate)))
            return {"surrogate": str(p if p.is_absolute() else base_dir / p)}
        d: dict[str, Any] = {"online": True}
        if self.kind == "study":
            url = resolve_url(self.storage_ref or "", "pruner.reference.storage")
            d = {"study": self.study, "storage": url}
        if self.min_trials is not None:
            d["min_trials"] = self.min_trials
        if self.max_trials is not None:
            d["max_trials"] = self.max_trials
        if self.prior is not None:
            p = Path(os.path.expanduser(self.prior))
            named = self.prior.strip().lower() in ("builtin", "none")
            d["prior"] = self.prior if named or p.is_absolute() else str(base_dir / p)
        if self.refit is not None:
            d["refit"] = self.refit
        if self.refit_growth is not None:
            d["refit_growth"] = self.refit_growth
        return d


class PrunerSpec(_Strict):
    """Pruner settings (see `collapse_hpo.hpo.optuna_side.pruner.CollapsePruner`): ``enabled``
    (``--no-prune`` turns it
    off), ``min_fraction`` (t̂ before which nothing is judged), ``confidence``, ``keep_top_k``,
    ``comparison`` ("paired": predictions at the same fraction, the default; or "interval"), ``margin``
    (the pruner's one knob: log-ratio by which a competitor must lead at a common fraction: 0.04 = 4%),
    ``report_prediction`` (give a pruned trial's predicted final loss to the sampler), ``judge_every``
    (judge at most once per this fraction of training) and ``reference``."""

    # The rule's settings are checked by PruneSettings and the judge (``_rule``), never here; the defaults
    # are theirs.
    enabled: bool = True
    min_fraction: float = PruneSettings.min_fraction
    confidence: float = PruneSettings.confidence
    keep_top_k: int = Field(default=PruneSettings.keep_top_k, le=MAX_TRIALS)
    comparison: str = PruneSettings.comparison
    margin: float = PruneSettings.margin
    report_prediction: bool = False
    judge_every: float = DEFAULT_JUDGE_EVERY
    reference: ReferenceSpec = Field(default_factory=lambda: ReferenceSpec(online=True))

    @field_validator("reference", mode="before")
    @classmethod
    def _reference_mapping(cls, v: Any) -> Any:
        # `reference: online` or `reference: s.json`, as the Python API takes them: say how to write them
        if isinstance(v, str):
            hint = "; did you mean {online: true}?" if near_online(v) else ""
            raise ValueError("write it as a mapping: {online: true}, {surrogate: PATH} or {study: NAME, "
                             f"storage: URL}}, got {excerpt(v)}{hint}")
        return v

    @model_validator(mode="after")
    def _rule(self) -> PrunerSpec:
        try:
            Judge(self.rule_settings(), judge_every=self.judge_every)
        except SettingError as err:
            raise _FieldError(f"pruner.{err.name}", err.problem) from None
        return self

    def rule_settings(self) -> PruneSettings:
        """The decision rule's settings (``PruneSettings``) this spec gives; checked when it was built."""
        return PruneSettings(min_fraction=self.min_fraction, confidence=self.confidence,
                             keep_top_k=self.keep_top_k, comparison=self.comparison, margin=self.margin)


class SamplerSpec(_Strict):
    """The Optuna sampler: ``name`` in random, qmc, grid, tpe, and its ``seed``."""

    name: Literal["random", "qmc", "grid", "tpe"] = "qmc"
    seed: int = 0


class ResourcesSpec(_Strict):
    """Resources per trial (Ray): CPUs and GPUs (fractions allowed)."""

    cpu: float = Field(default=1.0, gt=0, le=MAX_MODEL_DIM, allow_inf_nan=False)
    gpu: float = Field(default=0.0, ge=0, le=MAX_MODEL_DIM, allow_inf_nan=False)


class ExecutorSpec(_Strict):
    """Ray: a local cluster (``address`` null; ``num_cpus``/``num_gpus`` default to the machine's) or the
    ``address`` of a running cluster (``auto`` or ``ray://host:10001``)."""

    address: str | None = None
    num_cpus: int | None = Field(default=None, gt=0, le=MAX_MODEL_DIM)
    num_gpus: int | None = Field(default=None, ge=0, le=MAX_MODEL_DIM)


class HeartbeatSpec(_Strict):
    """Optuna heartbeat: a running trial records one every ``interval`` seconds; a trial whose last heartbeat
    is older than ``grace`` seconds is stale (its worker or driver died) and is rerun by ``resume``."""

    interval: int = Field(default=5, ge=1, le=86_400)
    grace: int = Field(default=30, ge=2, le=86_400)

    @model_validator(mode="after")
    def _grace(self) -> HeartbeatSpec:
        if self.grace <= self.interval:
            raise ValueError(f"grace ({self.grace} s) must be longer than interval ({self.interval} s)")
        return self


class TrainSpec(_Strict):
    """Trainer settings shared by every trial (see `collapse_hpo.trainers.config.TrainConfig`)."""

    corpus: str = "stdlib"
    device: str = "cpu"
    dtype: str = "float32"
    compile: bool = False
    micro_batch_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    report_every_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    val_fractions: list[float] | None = Field(default=None, max_length=1000)
    threads: int | None = Field(default=None, gt=0, le=MAX_MODEL_DIM)


class FaultSpec(_Strict):
    """An injected fault for reliability drills (off unless given).

    Trials of the listed ``draws`` at the listed ``attempts`` (0 = first try) get it from ``start_t_hat`` on.
    Kinds ``exception``, ``out_of_memory``, ``nan_loss``, ``loss_normalization`` are the trainer's
    (`trainers.config.FaultConfig`; ``acknowledge`` must be its exact phrase); ``kill_worker`` kills the Ray
    worker process running the trial.
    """

    acknowledge: str
    kind: Literal["exception", "out_of_memory", "nan_loss", "loss_normalization", "kill_worker"]
    draws: list[int] = Field(min_length=1, max_length=MAX_TRIALS)
    attempts: list[int] = Field(default_factory=lambda: [0], max_length=MAX_RETRIES + 1)
    start_t_hat: float = Field(default=0.3, ge=0, lt=1)

    @model_validator(mode="after")
    def _ack(self) -> FaultSpec:
        if self.acknowledge != FAULT_ACKNOWLEDGEMENT:
            raise ValueError(f"acknowledge must be exactly {FAULT_ACKNOWLEDGEMENT!r} (a fault breaks trials)")
        return self


class StageSpec(_Strict):
    """One stage of a multi-fidelity sweep (``stages:``, exactly two; hpo/sweep/stages.py runs them).

    Stage 1 sweeps the search space at a small shape: ``width`` (required) and ``depth`` (default: the
    model's). Stage 2 trains stage 1's ``top_k`` best settings at the target shape, which is ``model`` (so it
    takes no ``width``/``depth``): the LR is transferred as CompleteP prescribes and λ re-derived to hold τ.
    Either stage may give its own token budget, ``tpp`` or ``total_tokens`` (default: the sweep's).
    """

    width: int | None = Field(default=None, gt=0, le=MAX_MODEL_DIM)
    depth: int | None = Field(default=None, gt=0, le=MAX_MODEL_DIM)
    top_k: int | None = Field(default=None, ge=1, le=MAX_TRIALS)
    tpp: float | None = Field(default=None, gt=0, le=MAX_TPP, allow_inf_nan=False)
    total_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _budget(self) -> StageSpec:
        if self.tpp is not None and self.total_tokens is not None:
            raise ValueError("give at most one of 'tpp' and 'total_tokens' for a stage")
        return self


# Suffix of each stage's study name (``<name>-stage1``, ``<name>-stage2``); the longest name it may extend.
STAGE_SUFFIX = "-stage"
MAX_STAGED_NAME = MAX_NAME - len("-noprune" + STAGE_SUFFIX + "9")


class SweepConfig(_Strict):
    """A validated sweep file. Build it with `load_sweep`; ``source`` is the file it came from."""

    name: str = Field(min_length=1, max_length=MAX_NAME, pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelSpec
    tpp: float | None = Field(default=None, gt=0, le=MAX_TPP, allow_inf_nan=False)
    total_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    schedule: str | dict[str, Any] = "linear"
    tau: float | Literal["optimal"] | None = "optimal"
    fixed: dict[str, float | int | str] = Field(default_factory=dict)
    space: dict[str, Distribution] = Field(default_factory=dict)
    trials: int | None = Field(default=None, ge=1, le=MAX_TRIALS)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    storage: str | None = None
    retries: int = Field(default=0, ge=0, le=MAX_RETRIES)
    results: str | None = None
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    faults: list[FaultSpec] = Field(default_factory=list)
    stages: list[StageSpec] | None = None
    source: str | None = None

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        try:
            Schedule.parse(v)
        except InputError as err:
            raise ValueError(str(err).removeprefix("schedule: ")) from None
        return v

    @field_validator("tau", mode="before")
    @classmethod
    def _tau(cls, v: Any) -> float | str | None:
        if v is None or v == "optimal":
            return v
        if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
            raise ValueError("must be a positive number (fraction of training), 'optimal' (optimal_tau(tpp)) "
                             "or null (no weight decay)")
        return float(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v in (".", ".."):
            raise ValueError(f"{excerpt(v)} is a folder reference, not a name; use letters, digits, "
                             "'.', '_', '-'")
        return v

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str | None) -> str | None:
        if v is None or env_name(v) is not None:
            return v
        problem = url_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        if (self.tpp is None) == (self.total_tokens is None):
            raise _FieldError("tpp", "give exactly one of 'tpp' (tokens per parameter) or 'total_tokens' "
                              "(training tokens per trial; the TPP is then not defined, as in fine-tuning)")
        for where, names in (("fixed", self.fixed), ("space", self.space)):
            for key in names:
                if key not in HYPERPARAMETERS:
                    allowed = ", ".join(HYPERPARAMETERS)
                    raise _FieldError(f"{where}.{key}", f"unknown hyperparameter; allowed: {allowed}")
        both = set(self.fixed) & set(self.space)
        if both:
            key = sorted(both)[0]
            raise _FieldError(f"fixed.{key}", "is both fixed and searched; keep it in 'fixed' or in 'space'")
        given = set(self.fixed) | set(self.space)
        for key in ("lr", "batch_tokens"):
            if key not in given:
                raise _FieldError(key, "is needed: put it in 'fixed' (a value) or 'space' (a distribution)")
        tau_given = "tau" in self.model_fields_set or "tau" in given
        tau_null = "tau" in self.model_fields_set and self.tau is None
        try:
            check_one_decay(tau_given and not tau_null, "weight_decay" in given)
        except InputError as err:
            where = "space.weight_decay" if "weight_decay" in self.space else "fixed.weight_decay"
            raise _FieldError(where, str(err)) from None
        if "tau" in given and "tau" in self.model_fields_set:
            raise _FieldError("tau", "tau is set at the top level and in fixed/space; keep one")
        optimal = self.tau == "optimal" and "tau" not in given and "weight_decay" not in given
        if optimal and self.total_tokens is not None:
            default = "" if "tau" in self.model_fields_set else " (the default)"
            raise _FieldError("tau", f"'optimal'{default} is optimal_tau(tpp) and needs a TPP, but this "
                              "sweep gives total_tokens, so its TPP is not defined: give tau as a number "
                              "(fraction of training), null (no weight decay), or weight_decay in "
                              "fixed/space; or give tpp instead of total_tokens")
        for key in HYPERPARAMETERS:
            if key in self.fixed:
                value = self.fixed[key]
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    raise _FieldError(f"fixed.{key}", f"must be a finite number, got {excerpt(value)}")
                if abs(value) > MAX_TOKENS:
                    raise _FieldError(f"fixed.{key}",
                                      f"{excerpt(value)} is beyond any sweep (at most {MAX_TOKENS:.0e})")
                if key in ("lr", "batch_tokens", "tau", "width", "depth") and not value > 0:
                    raise _FieldError(f"fixed.{key}", f"must be positive, got {excerpt(value)}")
                if key in ("warmup", "decay", "final", "weight_decay") and value < 0:
                    raise _FieldError(f"fixed.{key}", f"must be non-negative, got {excerpt(value)}")
            if key in self.space:
                bounds = self.space[key].bounds()
                positive = key in ("lr", "batch_tokens", "tau", "width", "depth")
                if bounds is not None and positive and bounds[0] <= 0:
                    raise _FieldError(f"space.{key}.low", f"must be positive, got {bounds[0]}")
        if self.sampler.name == "grid":
            grid = 1
            for key, dist in self.space.items():
                try:
                    grid *= len(dist.values())
                except ValueError as err:
                    raise _FieldError(f"space.{key}", str(err)) from None
            if self.trials is not None and self.trials != grid:
                raise _FieldError("trials", f"the grid has {grid} points; drop 'trials' or set it to {grid}")
        elif self.trials is None:
            raise _FieldError("trials", "is needed (number of hyperparameter draws) unless sampler is grid")
        if len(set(self.seeds)) != len(self.seeds):
            raise _FieldError("seeds", "training seeds must be distinct")
        if self.n_trials > MAX_TRIALS:
            raise _FieldError("trials", f"{self.n_draws} draws × {len(self.seeds)} seeds = {self.n_trials} "
                              f"trials; at most {MAX_TRIALS}")
        if self.stages is not None:
            self._check_stages(self.stages)
        return self

    def _check_stages(self, stages: list[StageSpec]) -> None:
        """``stages:``: two stages, a small sweep then its top_k at the target shape (``model``)."""
        if len(stages) != 2:
            raise _FieldError("stages", f"give exactly 2 stages (a sweep at a small width, then its top_k at "
                              f"the model's width); got {len(stages)}")
        first, last = stages
        if first.width is None:
            raise _FieldError("stages.0.width", "is needed: the small width stage 1 sweeps at")
        if first.top_k is not None:
            raise _FieldError("stages.0.top_k", "belongs to stage 2 (stage 1 sweeps the whole space)")
        for key in ("width", "depth"):
            if getattr(last, key) is not None:
                raise _FieldError(f"stages.1.{key}", f"stage 2 trains the target shape: set model.{key} "
                                  "instead")
        if last.top_k is None:
            raise _FieldError("stages.1.top_k", "is needed: how many of stage 1's best settings to take")
        if last.top_k > self.n_draws:
            raise _FieldError("stages.1.top_k", f"{last.top_k} is more than the {self.n_draws} settings "
                              "stage 1 sweeps; lower it or raise trials")
        heads = self.model.heads
        if first.width % heads or (first.width // heads) % 2:
            raise _FieldError("stages.0.width", f"{first.width} must be a multiple of 2 × model.heads "
                              f"({2 * heads}): the same heads at every width, each of even size (RoPE)")
        small = (first.width, first.depth or self.model.depth)
        if small[0] > self.model.width or small[1] > self.model.depth or small == (self.model.width,
                                                                                   self.model.depth):
            raise _FieldError("stages.0.width", f"stage 1's shape (width {small[0]}, depth {small[1]}) must "
                              f"be smaller than the target model (width {self.model.width}, depth "
                              f"{self.model.depth})")
        for key in ("width", "depth"):
            if key in self.fixed or key in self.space:
                where = "space" if key in self.space else "fixed"
                raise _FieldError(f"{where}.{key}", "cannot be set in a sweep with stages (each stage has "
                                  "its shape); drop it")
        given = set(self.fixed) | set(self.space)
        if self.tau == "optimal" and "tau" not in given and "weight_decay" not in given:
            for i, st in enumerate(stages):
                if st.total_tokens is not None:
                    default = "" if "tau" in self.model_fields_set else " (the default)"
                    raise _FieldError(
                        f"stages.{i}.total_tokens", f"tau 'optimal'{default} is optimal_tau(tpp) and needs "
                        "a TPP, but this stage gives total_tokens, so its TPP is not defined: give the "
                        "stage a tpp instead, or tau as a number (fraction of training) or null")
        if len(self.name) > MAX_STAGED_NAME:
            raise _FieldError("name", f"at most {MAX_STAGED_NAME} characters with stages (each stage's study "
                              f"is named '<name>{STAGE_SUFFIX}N')")

    # ------------------------------------------------------------------ derived quantities
    @property
    def planned(self) -> bool:
        """True when the sampler's draws do not depend on results (the plan is drawn up front)."""
        return self.sampler.name in PLANNED_SAMPLERS

    @property
    def n_draws(self) -> int:
        """Number of hyperparameter draws (each is trained once per seed)."""
        if self.sampler.name == "grid":
            n = 1
            for dist in self.space.values():
                n *= len(dist.values())
            return n
        return int(self.trials or 0)

    @property
    def n_trials(self) -> int:
        """Planned trials: draws × seeds (retries and reruns come on top)."""
        return self.n_draws * len(self.seeds)

    def base_dir(self) -> Path:
        """The folder relative paths inside the file are resolved against (the file's folder)."""
        return Path(self.source).resolve().parent if self.source else Path.cwd()

    def results_dir(self, override: str | os.PathLike[str] | None = None) -> Path:
        """Results folder: ``override`` (CLI), else ``results`` of the file, else ``results/<name>`` (cwd)."""
        if override is not None:
            return Path(override).resolve()
        if self.results:
            return Path(self.results).resolve()
        return (Path.cwd() / "results" / self.name).resolve()

    def storage_url(self, results_dir: Path) -> str:
        """The Optuna storage URL as it may be persisted: ``storage`` of the file (a URL or ``${NAME}``),
        else ``${COLLAPSE_HPO_STORAGE}`` when that variable is set, else a SQLite file ``study.db`` in the
        results. Resolve a ``${NAME}`` with `collapse_hpo.hpo.sweep.urls.resolve_url` where it is opened."""
        if self.storage:
            return self.storage
        if os.environ.get(STORAGE_ENV):
            return "${" + STORAGE_ENV + "}"

        return sqlite_url(results_dir / "study.db")

    def reference_path(self) -> Path | None:
        """The surrogate file of a ``surrogate`` reference, resolved against the sweep file's folder."""
        ref = self.pruner.reference
        if ref.kind != "surrogate":
            return None
        return Path(ref.spec(self.base_dir())["surrogate"])

    def to_jsonable(self) -> dict[str, Any]:
        """A JSON-ready dict (shipped to Ray workers); `SweepConfig.model_validate` inverts it."""
        return self.model_dump(mode="json")


class _FieldError(ValueError):
    """A cross-field error with the field it belongs to (turned into an `InputError`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _allowed_keys(loc: tuple[Any, ...]) -> list[str] | None:
    """The keys allowed at ``loc`` (the parent of an unknown key), walking the pydantic models."""
    model: Any = SweepConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            if model is Distribution or part in getattr(model, "model_fields", {}):
                continue
            # A dict value (e.g. space.<name>): the next model is the value type.
            if model is SweepConfig:
                return None
            continue
        ann = field.annotation
        nxt = None
        for cand in (ModelSpec, Distribution, ReferenceSpec, PrunerSpec, SamplerSpec, ResourcesSpec,
                     ExecutorSpec, HeartbeatSpec, TrainSpec, FaultSpec, StageSpec):
            if ann is cand or cand.__name__ in str(ann):
                nxt = cand
                break
        if nxt is None:
            return None
        model = nxt
    return [k for k in getattr(model, "model_fields", {}) if k != "source"]


def _format_error(path: str, err: ValidationError) -> str:
    errors = err.errors()
    # A misspelled key comes with the required field it was meant to be ("model.widht" with "model.width":
    # Field required): name the unknown key first, with the keys allowed there.
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
    # pydantic puts union branch names in the location ("float", "literal['optimal']"): drop them.
    clean: list[Any] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in ("float", "int", "str", "bool", "none", "dict")):
            continue
        clean.append(part)
    field = clip(".".join(str(x) for x in clean), 2 * EXCERPT_CHARS) or "(top level)"
    if e["type"] == "extra_forbidden":
        allowed = _allowed_keys(tuple(clean[:-1]))
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"{path}: field '{field}': unknown key{hint}"
    ctx = e.get("ctx") or {}
    inner = ctx.get("error")
    if isinstance(inner, _FieldError):
        return f"{path}: field '{clip(inner.field, 2 * EXCERPT_CHARS)}': {inner.message}"
    msg = str(e["msg"]).removeprefix("Value error, ")
    got = e.get("input")
    quiet = e["type"] == "missing" or isinstance(got, dict | list) or "got " in msg
    shown = "" if quiet else f" (got {excerpt(got)})"
    return f"{path}: field '{field}': {msg}{shown}"


def parse_sweep(data: Any, path: str = "<sweep>") -> SweepConfig:
    """Validate a parsed YAML document into a `SweepConfig`; `InputError` names ``path`` and the field."""
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise InputError(f"{path}: expected a mapping of sweep fields at the top level, got {kind}")
    if "source" in data:
        raise InputError(f"{path}: field 'source': unknown key (it is set from the file name)")
    try:
        return SweepConfig.model_validate({**data, "source": path})
    except ValidationError as err:
        raise InputError(_format_error(path, err)) from None


class _DuplicateKey(ValueError):
    """A mapping of the sweep file gives one key twice."""


def _unique_key_loader() -> type:
    """A `yaml.SafeLoader` that refuses a key given twice in one mapping, naming both lines (PyYAML's own
    loader keeps the last value silently: a second ``pruner:`` block would replace the first)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader reports it
                    continue
                if first is not None:
                    raise _DuplicateKey(f"line {line}: key {excerpt(key)} is given twice (first at line "
                                        f"{first}); keep one")
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _expanded_nodes(root: Any, limit: int) -> int:
    """The number of YAML nodes ``root`` stands for once every alias is expanded, counting up to just past
    ``limit`` (each distinct node is visited once: an alias bomb is measured without being built)."""
    import yaml

    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            if sizes[key] < 0:
                raise _AliasError("an alias refers to the anchor that contains it (a recursive structure)")
            return sizes[key]
        sizes[key] = -1
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[Any] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total = min(total + size(child), limit + 1)
        sizes[key] = total
        return total

    return size(root)


class _AliasError(ValueError):
    """The document's aliases expand beyond what a sweep file holds, or into themselves."""


def _read_yaml(p: Path) -> Any:
    """The YAML document in ``p``: at most `MAX_SWEEP_BYTES`, composed (with aliases) into at most
    `MAX_YAML_NODES` expanded nodes before any Python object is built; an `InputError` otherwise."""
    import yaml

    try:
        with p.open("rb") as f:
            raw = f.read(MAX_SWEEP_BYTES + 1)
    except OSError as err:
        raise InputError(f"{p}: cannot read the sweep file ({err})") from None
    if len(raw) > MAX_SWEEP_BYTES:
        raise InputError(f"{p}: the sweep file is over {MAX_SWEEP_BYTES // 1024} KiB, the most a sweep file "
                         "may be (a sweep is a few hundred bytes); check that this is the sweep YAML")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{p}: cannot read the sweep file ({err})") from None
    loader = _unique_key_loader()(text)  # a SafeLoader subclass
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_nodes(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise _AliasError(f"expands to more than {MAX_YAML_NODES} YAML nodes (each alias *name repeats "
                              "the whole content of its anchor &name); a sweep file has a few hundred: write "
                              "the values out, or use fewer aliases")
        return loader.construct_document(node)
    except (_DuplicateKey, _AliasError) as err:
        raise InputError(f"{p}: {err}") from None
    except RecursionError:
        raise InputError(f"{p}: nested too deeply to be a sweep file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise InputError(f"{p}: not valid YAML{where}: {clip(str(problem), 2 * EXCERPT_CHARS)}") from None
    finally:
        loader.dispose()


def load_sweep(path: str | os.PathLike[str]) -> SweepConfig:
    """Read and validate a sweep YAML file. Creates nothing; every error is an `InputError` naming it."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: sweep file not found (give a sweep YAML, e.g. studies/quickstart.yaml)")
    data = _read_yaml(p)
    if data is None:
        raise InputError(f"{p}: the sweep file is empty (see studies/quickstart.yaml for an example)")
    return parse_sweep(data, str(p))
