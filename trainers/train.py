"""The training loop: `train(config, reporter) -> TrainResult`, reporting (tokens, t̂, loss, lr) as it goes.

Token accounting is exact: optimizer step k (0-based) consumes tokens [k·B, (k+1)·B) and
t̂ = tokens / D, with D = steps·B (trainers/config.py). A step is ``B / micro_batch_tokens`` micro-batches;
each micro-batch's summed loss is divided by the step's B tokens before backward, so the accumulated
gradient is the mean over the whole batch whatever the micro-batch size. The LR of step k is the schedule
at its middle token (trainers/optim.py).

Reports: every ``report_every_tokens`` tokens (whole steps; plus the last step and every validation point) the
reporter gets a `Report` whose ``loss`` is the mean training loss (nats per token) over the tokens since the
previous report, at ``tokens`` = tokens seen so far; ``lr`` is the hidden matrices' LR of the last step;
``val_loss`` is set at the first report at or past each of ``val_fractions``. An exception raised by the
reporter (e.g. ``optuna.TrialPruned``) propagates out of `train` and stops the run.

Determinism: on CPU, a seed (and thread count) fixes every number: init from ``torch.manual_seed(seed)``, data
order from the data seed, no dropout. Resuming from a checkpoint gives the same losses as a run that was never
interrupted (tested bit for bit on CPU).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from collapse_hpo.kernels.cross_entropy import fused_linear_cross_entropy
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.trainers.checkpoint import fingerprint, load_checkpoint, save_checkpoint
from collapse_hpo.trainers.config import Plan, TrainConfig, count_parameters, plan
from collapse_hpo.trainers.data import TrainBatches, load_corpus, validation_windows
from collapse_hpo.trainers.fault import StepHook
from collapse_hpo.trainers.model import GPT
from collapse_hpo.trainers.optim import build_optimizer, set_lr, step_lr

__all__ = ["Report", "TrainConfig", "TrainResult", "count_parameters", "train"]

log = logging.getLogger("collapse_hpo.trainers")


@dataclass(frozen=True)
class Report:
    """One point of the curve: after ``tokens`` tokens (t̂ = tokens / total_tokens), the mean training
    ``loss`` (nats/token) since the previous report, the hidden matrices' ``lr`` of the last step, and the
    validation loss where one was computed (else None)."""

    tokens: int
    t_hat: float
    loss: float
    lr: float
    val_loss: float | None = None


@dataclass
class TrainResult:
    """A finished run: its final training loss (the last report's), the curve and the run's metadata.

    ``metadata`` keys: params_non_embedding, params_total, lr, base_lr, weight_decay, tau (None = no decay),
    tpp, total_tokens, requested_total_tokens, batch_tokens, micro_batch_tokens, steps, corpus, corpus_sha256,
    corpus_hash_kind, corpus_train_tokens, corpus_val_tokens, fault (dict or None), seed, data_seed, schedule,
    config, warnings, device, dtype, threads, torch, resumed_from_tokens, train_seconds, tokens_per_second.
    """

    final_loss: float
    curve: list[Report]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def final_val_loss(self) -> float | None:
        """The validation loss at t̂ = 1 (None when 1.0 is not among val_fractions)."""
        last = self.curve[-1] if self.curve else None
        return None if last is None or last.t_hat < 1.0 else last.val_loss

    def to_curve(self, run: str):
        """This run as a `collapse_hpo.predictors.curves.Curve` (t̂, loss, absolute lr, schedule, τ, TPP)."""
        import numpy as np

        from collapse_hpo.predictors.curves import Curve
        from collapse_hpo.predictors.schedules import Schedule

        md = self.metadata
        return Curve(
            run=run,
            t_hat=np.array([r.t_hat for r in self.curve]),
            loss=np.array([r.loss for r in self.curve]),
            lr=np.array([r.lr for r in self.curve]),
            schedule=Schedule.from_dict(md["schedule"]),
            tau=md["tau"],
            tpp=md["tpp"],
            meta={"seed": md["seed"], "params_non_embedding": md["params_non_embedding"]},
        )


Reporter = Callable[[Report], None]


@contextlib.contextmanager
def _threads(n: int | None):
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _autocast(config: TrainConfig):
    if config.dtype == "bfloat16":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _head_dtype(config: TrainConfig) -> torch.dtype:
    return torch.bfloat16 if config.dtype == "bfloat16" else torch.float32


@torch.no_grad()
def evaluate(
    model: GPT,
    forward: Callable[[torch.Tensor], torch.Tensor],
    windows: torch.Tensor,
    config: TrainConfig,
    micro_batch_tokens: int,
) -> float:
    """Mean loss (nats/token) of ``model`` on validation ``windows`` [n, context + 1]."""
    device = torch.device(config.device)
    per = max(1, micro_batch_tokens // config.context)
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for s in range(0, windows.shape[0], per):
        seq = windows[s : s + per].to(device)
        x, y = seq[:, :-1], seq[:, 1:]
        with _autocast(config):
            h = forward(x)
        h = h.reshape(-1, h.shape[-1]).detach().to(_head_dtype(config))
        w = model.unembed.weight.detach().to(_head_dtype(config))
        total += fused_linear_cross_entropy(
            h, w, y.reshape(-1), logit_scale=model.logit_scale, reduction="sum"
        ).double()
        count += y.numel()
    return float(total) / count


def _metadata(config: TrainConfig, p: Plan, corpus, batches: TrainBatches, warnings: list[str]) -> dict:
    return {
        "params_non_embedding": p.params_non_embedding,
        "params_total": p.params_total,
        "lr": config.lr,
        "base_lr": p.base_lr,
        "weight_decay": p.weight_decay,
        "tau": p.tau,
        "tpp": p.tpp,
        "total_tokens": p.total_tokens,
        "requested_total_tokens": p.requested_total_tokens,
        "batch_tokens": config.batch_tokens,
        "micro_batch_tokens": p.micro_batch_tokens,
        "steps": p.steps,
        "m_n": p.m_n,
        "m_l": p.m_l,
        "corpus": corpus.name,
        "corpus_sha256": corpus.sha256,
        "corpus_hash_kind": corpus.hash_kind,
        "corpus_train_tokens": corpus.train_tokens,
        "corpus_val_tokens": corpus.val_tokens,
        "corpus_tokens_per_pass": batches.tokens_per_pass,
        "fault": None if config.fault is None else config.fault.to_dict(),
        "seed": config.seed,
        "data_seed": config.seed if config.data_seed is None else config.data_seed,
        "schedule": config.schedule.to_dict(),
        "config": config.to_dict(),
        "warnings": warnings,
        "device": config.device,
        "dtype": config.dtype,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "resumed_from_tokens": None,
    }


def train(config: TrainConfig, reporter: Reporter | None = None) -> TrainResult:
    """Train one run of ``config``; call ``reporter(Report)`` at the report cadence; return the result.

    With ``config.checkpoint_dir`` set, a checkpoint of the same config there is resumed (the reporter then
    gets only the new reports, unless ``report_past_on_resume``), and checkpoints are written every
    ``checkpoint_every_tokens``. Raises InputError for a bad corpus or checkpoint; reporter exceptions
    propagate; an injected fault of kind ``exception`` or ``out_of_memory`` raises at its t̂.
    """
    if not isinstance(config, TrainConfig):
        raise InputError(f"train: config must be a TrainConfig, got {type(config).__name__}")
    with _threads(config.threads):
        return _train(config, reporter)


def _train(config: TrainConfig, reporter: Reporter | None) -> TrainResult:
    p = plan(config)
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"TrainConfig.device: {config.device!r} but CUDA is not available; use device='cpu'")
    corpus = load_corpus(config.corpus, config.context)
    if corpus.vocab_needed > config.vocab_size:
        raise InputError(
            f"TrainConfig.vocab_size: corpus {corpus.name} has token ids up to "
            f"{corpus.vocab_needed - 1}; set vocab_size to at least {corpus.vocab_needed}"
        )
    data_seed = config.seed if config.data_seed is None else config.data_seed
    batches = TrainBatches(corpus, config.context, config.vocab_size, data_seed)
    val_windows = validation_windows(corpus, config.context, config.val_tokens)

    warnings: list[str] = []
    if p.total_tokens > batches.tokens_per_pass:
        msg = (
            f"this run of {p.total_tokens} tokens repeats data: corpus {corpus.name} has "
            f"{batches.tokens_per_pass} training tokens per pass "
            f"({p.total_tokens / batches.tokens_per_pass:.2f} passes)"
        )
        warnings.append(msg)
        log.warning(msg)
    if config.fault is not None:
        msg = f"fault injection is ON: {config.fault.to_dict()}"
        warnings.append(msg)
        log.warning(msg)
    if p.total_tokens != round(p.requested_total_tokens):
        log.info(
            "total_tokens %d (requested %.0f, rounded to %d steps of %d tokens)",
            p.total_tokens,
            p.requested_total_tokens,
            p.steps,
            config.batch_tokens,
        )
    metadata = _metadata(config, p, corpus, batches, warnings)

    torch.manual_seed(config.seed)
    model = GPT(config).to(device)
    optimizer = build_optimizer(model, config, p)
    forward: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if config.compile else model

    B, D, ctx = config.batch_tokens, p.total_tokens, config.context
    curve: list[Report] = []
    step = 0
    window_loss = torch.zeros((), dtype=torch.float64, device=device)
    window_tokens = 0
    val_done = 0  # number of val_fractions already evaluated
    fractions = sorted(set(config.val_fractions))

    state = load_checkpoint(config)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        curve = [Report(**r) for r in state["curve"]]
        window_loss.fill_(state["window_loss"])
        window_tokens = state["window_tokens"]
        val_done = sum(1 for f in fractions if f * D <= state["step"] * B + 1e-9)
        metadata["resumed_from_tokens"] = step * B
        log.info("resumed from %s at %d tokens (t_hat %.4f)", config.checkpoint_dir, step * B, step * B / D)
        if reporter is not None and config.report_past_on_resume:
            for r in curve:
                reporter(r)

    def checkpoint(finished: bool) -> None:
        if config.checkpoint_dir is None:
            return
        save_checkpoint(
            config.checkpoint_dir,
            {
                "fingerprint": fingerprint(config),
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "curve": [asdict(r) for r in curve],
                "window_loss": float(window_loss),
                "window_tokens": window_tokens,
                "finished": finished,
                "metadata": metadata,
            },
        )

    hook = StepHook(config.fault, D, p.micro_batch_tokens)  # fault drills: the loop's only contact with them
    started = time.perf_counter()
    start_tokens = step * B
    lr = step_lr(config.schedule, max(step - 1, 0), B, D, config.lr)
    while step < p.steps:
        tokens_before = step * B
        step_plan = hook.before_step(tokens_before)
        micro = step_plan.micro_batch_tokens

        lr = step_lr(config.schedule, step, B, D, config.lr)
        set_lr(optimizer, lr)
        per_micro = micro // ctx
        first_seq = tokens_before // ctx
        for m in range(B // micro):
            x, y = batches.get(first_seq + m * per_micro, per_micro)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with _autocast(config):
                h = forward(x)
            h = h.reshape(-1, h.shape[-1]).to(_head_dtype(config))
            w = model.unembed.weight.to(_head_dtype(config))
            loss = step_plan.loss_sum(h, w, y.reshape(-1), model.logit_scale)
            (loss / B).backward()
            window_loss += loss.detach().double()
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        window_tokens += B
        tokens = step * B

        val_due = val_done < len(fractions) and tokens >= fractions[val_done] * D - 1e-9
        if val_due or tokens % p.report_every_tokens == 0 or step == p.steps:
            val_loss = None
            if val_due:
                val_loss = evaluate(model, forward, val_windows, config, p.micro_batch_tokens)
                while val_done < len(fractions) and tokens >= fractions[val_done] * D - 1e-9:
                    val_done += 1
            report = Report(
                tokens=tokens,
                t_hat=tokens / D,
                loss=float(window_loss) / window_tokens,
                lr=lr,
                val_loss=val_loss,
            )
            window_loss.zero_()
            window_tokens = 0
            curve.append(report)
            if reporter is not None:
                reporter(report)
        if config.checkpoint_dir is not None and tokens % p.checkpoint_every_tokens == 0 and step < p.steps:
            checkpoint(finished=False)

    elapsed = time.perf_counter() - started
    metadata["train_seconds"] = elapsed
    metadata["tokens_per_second"] = (step * B - start_tokens) / elapsed if elapsed > 0 else None
    if state is not None and state.get("finished"):
        metadata = {**state["metadata"], "resumed_from_tokens": step * B}
    checkpoint(finished=True)
    return TrainResult(final_loss=curve[-1].loss, curve=curve, metadata=metadata)
