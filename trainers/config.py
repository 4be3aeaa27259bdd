"""What one training run is: `TrainConfig`, the opt-in `FaultConfig`, and the quantities derived from them.

Everything here is plain Python (no torch), so a sweep driver can size and check a run without building it:
`count_parameters` gives N from the shape, `plan(config)` gives the token budget, steps, λ or τ and the
CompleteP multipliers. Units: tokens everywhere (never steps); ``lr`` is the peak LR applied to the hidden
matrices.

Conventions (METHOD.md §2, §7):
- m_N = width / base_width, m_L = depth / base_depth (CompleteP, α = 1).
- ``lr`` η is the peak LR of the hidden matrices; the embeddings, the unembedding and the LayerNorm
  parameters get the base LR η·m_N. ``weight_decay`` λ is the decay of the hidden matrices; embeddings and
  unembedding get λ/m_N, so every decayed parameter has the same η·λ and the same timescale τ = B/(ηλD).
- total_tokens D is a whole number of optimizer steps of ``batch_tokens`` B tokens; with ``tpp`` it is
  round(tpp·N / B)·B, so the actual TPP is D/N (recorded in the run's metadata).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.timescale import check_one_decay, derive_decay, no_decay_tau

#: The exact phrase a FaultConfig needs in its ``acknowledge`` field. A fault corrupts training on purpose.
FAULT_ACKNOWLEDGEMENT = "I am injecting a training fault on purpose"

FAULT_KINDS = ("loss_normalization", "exception", "out_of_memory", "nan_loss")
MLP_KINDS = ("squared_relu", "swiglu")
POSITION_KINDS = ("rope", "alibi")
DTYPES = ("float32", "bfloat16")


def default_schedule() -> Schedule:
    """The default LR schedule: linear warmup over 10% of tokens, then linear decay to zero (Celerity)."""
    return Schedule(kind="linear", warmup=0.1)


def swiglu_hidden(width: int, mlp_ratio: float) -> int:
    """Hidden size of a SwiGLU MLP with about the parameters of a 2-matrix MLP of ratio ``mlp_ratio``.

    2/3 · mlp_ratio · width rounded up to a multiple of 8 (3 matrices instead of 2).
    """
    h = math.ceil(2.0 * mlp_ratio * width / 3.0)
    return max(8, 8 * math.ceil(h / 8))


def mlp_hidden(width: int, mlp: str, mlp_ratio: float) -> int:
    """Hidden size of the MLP: round(mlp_ratio · width) for squared-ReLU, see `swiglu_hidden` for SwiGLU."""
    return swiglu_hidden(width, mlp_ratio) if mlp == "swiglu" else round(mlp_ratio * width)


def count_parameters(
    width: int,
    depth: int,
    heads: int,
    *,
    vocab_size: int = 256,
    mlp: str = "squared_relu",
    mlp_ratio: float = 4.0,
) -> tuple[int, int]:
    """Parameter counts (non_embedding, total) of the model `trainers.model.GPT` builds, without building it.

    Per block: two LayerNorms (gain and bias, 4·width), attention (QKV and output, 4·width²) and the MLP
    (2·width·hidden for squared-ReLU, 3·width·hidden for SwiGLU); plus the final LayerNorm (2·width).
    Non-embedding excludes the token embedding and the (untied) unembedding, vocab_size·width each. RoPE and
    ALiBi have no parameters. ``heads`` is checked (it must divide ``width``) but does not change the count.
    """
    for name, value in (("width", width), ("depth", depth), ("heads", heads), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"count_parameters: {name} must be a positive integer, got {value!r}")
    if width % heads:
        raise InputError(
            f"count_parameters: width {width} is not divisible by heads {heads}; pick heads dividing it"
        )
    if mlp not in MLP_KINDS:
        raise InputError(f"count_parameters: mlp must be one of {', '.join(MLP_KINDS)}, got {mlp!r}")
    hidden = mlp_hidden(width, mlp, mlp_ratio)
    n_mlp = (3 if mlp == "swiglu" else 2) * width * hidden
    per_block = 4 * width + 4 * width * width + n_mlp
    non_embedding = depth * per_block + 2 * width
    return non_embedding, non_embedding + 2 * vocab_size * width


@dataclass(frozen=True)
class FaultConfig:
    """An injected training fault, for testing anomaly detection and fault handling. Off unless given.

    A FaultConfig is refused unless ``acknowledge`` equals `FAULT_ACKNOWLEDGEMENT` exactly; a run with one
    records it in its metadata and logs a warning. Kinds (all switched on from ``start_t_hat``, measured in
    tokens seen before an optimizer step):

    - ``loss_normalization`` (the paper's 1.8B failure, small): the loss kernel mis-normalizes at one
      micro-batch size. From ``start_t_hat`` the run continues at ``micro_batch_tokens`` per micro-batch (a
      restart on other hardware; with exact token normalization that alone changes nothing), and at exactly
      that micro-batch size the backward of the loss uses a softmax whose denominator is too small by the
      factor ``1 + strength`` for the last ``rows_fraction`` of the micro-batch's token rows. The loss value
      itself stays correct, so the reported curve is honest; the gradient is biased (an extra push of
      ``strength``·softmax on every logit, which flattens the predictions and drags the hidden states), so
      the loss drifts away from its collapse curve slowly. See trainers/fault.py. Measured on a 99K-parameter,
      20-TPP run from t̂ = 0.4 (BENCHMARKS.md, section 2): strength 0.1 ends 2% above the clean run
      and 0.2 ends 8% above it, both with a normalized residual that grows steadily from t̂ = 0.4 while the raw
      loss keeps falling; 0.3 ends 16% above and 1.0 (the default, a strong fault) 65% above.
    - ``exception``: raises `InjectedFault` (a RuntimeError) at the first step at or past ``start_t_hat``.
    - ``out_of_memory``: raises ``torch.OutOfMemoryError`` there instead (a simulated OOM).
    - ``nan_loss``: from there, the loss of every micro-batch is multiplied by NaN: the run diverges (NaN
      losses are reported, the weights become NaN) without raising.
    """

    acknowledge: str
    kind: str = "loss_normalization"
    start_t_hat: float = 0.4
    micro_batch_tokens: int | None = None
    strength: float = 1.0
    rows_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.acknowledge != FAULT_ACKNOWLEDGEMENT:
            raise InputError(
                f"fault.acknowledge must be exactly {FAULT_ACKNOWLEDGEMENT!r}: "
                "a fault corrupts training on purpose"
            )
        if self.kind not in FAULT_KINDS:
            raise InputError(f"fault.kind must be one of {', '.join(FAULT_KINDS)}, got {self.kind!r}")
        if not _is_number(self.start_t_hat) or not 0.0 <= self.start_t_hat < 1.0:
            raise InputError(
                f"fault.start_t_hat must be a fraction of training in [0, 1), got {self.start_t_hat!r}"
            )
        if self.micro_batch_tokens is not None and not _is_positive_int(self.micro_batch_tokens):
            raise InputError(
                f"fault.micro_batch_tokens must be a positive integer, got {self.micro_batch_tokens!r}"
            )
        if not _is_number(self.strength) or self.strength <= 0.0:
            raise InputError(f"fault.strength must be a positive number, got {self.strength!r}")
        if not _is_number(self.rows_fraction) or not 0.0 < self.rows_fraction <= 1.0:
            raise InputError(f"fault.rows_fraction must be in (0, 1], got {self.rows_fraction!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the acknowledgement included); ``FaultConfig(**d)`` inverts it."""
        return dataclasses.asdict(self)


class InjectedFault(RuntimeError):
    """Raised by a run with a FaultConfig of kind ``exception``."""


def _is_number(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)


def _is_positive_int(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, int) and x > 0


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Build it with keywords; invalid values raise InputError naming the field.

    Shape and parameterization:
        width, depth, heads: model shape (heads must divide width).
        base_width, base_depth: the CompleteP base shape; m_N = width/base_width, m_L = depth/base_depth.
        mlp: "squared_relu" (default, as Celerity) or "swiglu"; mlp_ratio: MLP hidden / width (4).
        position: "rope" (default; rotary on q and k, keeps flash attention on CUDA) or "alibi".
        context: sequence length in tokens (128). vocab_size: 256 for bytes; a token-id corpus needs its own.
        init_std: base init std σ of all matrices (hidden ones get σ/√m_N).
    Token budget (at most one of tpp and total_tokens; neither means tpp = 20):
        tpp: tokens per non-embedding parameter. total_tokens: D in tokens.
        batch_tokens: B, tokens per optimizer step (a multiple of context).
        micro_batch_tokens: tokens per forward/backward (divides batch_tokens, multiple of context; None = B).
    Optimizer:
        lr: peak LR η of the hidden matrices. tau or weight_decay: at most one (neither = no weight decay).
        schedule: a predictors Schedule (or its name or dict); default linear warmup 10%, decay to zero.
        adam_beta1, adam_beta2, adam_eps (base ε; hidden matrices get ε/(m_N·m_L)), grad_clip (None = off).
    Run:
        seed (model init), data_seed (order of the training sequences, 0 by default and independent of seed:
        every run with the same total_tokens sees the same tokens at the same t̂, so the batch-content noise
        is common to all runs of a sweep; None = use seed), device ("cpu", "cuda", "cuda:1", ...),
        dtype ("float32", or "bfloat16" autocast on CUDA), compile (torch.compile, CUDA), threads (torch CPU
        threads during the run; None leaves torch's setting), corpus ("stdlib", a text file or folder, a
        nanoGPT uint16 .bin token file or a folder with train.bin and val.bin), val_tokens (held-out tokens
        evaluated), report_every_tokens (reporter cadence, rounded up to a whole step; None = 1/100 of the
        run), val_fractions (t̂ at which validation loss is computed), checkpoint_dir (None = no checkpoints),
        checkpoint_every_tokens (None = every 10% of the run), report_past_on_resume (replay stored reports to
        the reporter after a resume), fault (a FaultConfig; None = off).
    """

    width: int = 64
    depth: int = 2
    heads: int = 4
    base_width: int = 64
    base_depth: int = 2
    mlp: str = "squared_relu"
    mlp_ratio: float = 4.0
    position: str = "rope"
    context: int = 128
    vocab_size: int = 256
    init_std: float = 0.02
    tpp: float | None = None
    total_tokens: int | None = None
    batch_tokens: int = 4096
    micro_batch_tokens: int | None = None
    lr: float = 3e-3
    tau: float | None = None
    weight_decay: float | None = None
    schedule: Schedule = field(default_factory=default_schedule)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float | None = 1.0
    seed: int = 0
    data_seed: int | None = 0
    device: str = "cpu"
    dtype: str = "float32"
    compile: bool = False
    threads: int | None = None
    corpus: str = "stdlib"
    val_tokens: int = 32768
    report_every_tokens: int | None = None
    val_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    checkpoint_dir: str | None = None
    checkpoint_every_tokens: int | None = None
    report_past_on_resume: bool = False
    fault: FaultConfig | None = None

    def __post_init__(self) -> None:
        # Normalize convertible fields (frozen dataclass: object.__setattr__).
        if not isinstance(self.schedule, Schedule):
            object.__setattr__(self, "schedule", Schedule.parse(self.schedule))
        # One "no weight decay" encoding: tau None (a legacy inf or "inf" is read as None).
        object.__setattr__(self, "tau", no_decay_tau(self.tau))
        if isinstance(self.fault, dict):
            try:
                object.__setattr__(self, "fault", FaultConfig(**self.fault))
            except TypeError as err:
                raise InputError(
                    f"fault: {err}; fields are {', '.join(FaultConfig.__dataclass_fields__)}"
                ) from None
        elif self.fault is not None and not isinstance(self.fault, FaultConfig):
            raise InputError(f"fault must be a FaultConfig or None, got {type(self.fault).__name__}")
        if isinstance(self.val_fractions, list):
            object.__setattr__(self, "val_fractions", tuple(self.val_fractions))
        if self.corpus is not None and not isinstance(self.corpus, str):
            object.__setattr__(self, "corpus", str(self.corpus))
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, str):
            object.__setattr__(self, "checkpoint_dir", str(self.checkpoint_dir))
        self._validate()

    def _validate(self) -> None:
        def bad(name: str, msg: str) -> InputError:
            return InputError(f"TrainConfig.{name}: {msg}")

        for name in (
            "width",
            "depth",
            "heads",
            "base_width",
            "base_depth",
            "context",
            "vocab_size",
            "batch_tokens",
        ):
            if not _is_positive_int(getattr(self, name)):
                raise bad(name, f"must be a positive integer, got {getattr(self, name)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise bad("seed", f"must be a non-negative integer, got {self.seed!r}")
        if self.data_seed is not None and (
            isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int) or self.data_seed < 0
        ):
            raise bad("data_seed", f"must be a non-negative integer or None, got {self.data_seed!r}")
        if self.width % self.heads:
            raise bad(
                "heads", f"width {self.width} is not divisible by heads {self.heads}; pick heads dividing it"
            )
        if self.position == "rope" and (self.width // self.heads) % 2:
            raise bad("heads", f"RoPE needs an even head size; width/heads = {self.width // self.heads}")
        if self.mlp not in MLP_KINDS:
            raise bad("mlp", f"must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if self.position not in POSITION_KINDS:
            raise bad("position", f"must be one of {', '.join(POSITION_KINDS)}, got {self.position!r}")
        for name in ("mlp_ratio", "init_std", "lr", "adam_eps"):
            v = getattr(self, name)
            if not _is_number(v) or v <= 0:
                raise bad(name, f"must be a positive number, got {v!r}")
        for name in ("adam_beta1", "adam_beta2"):
            v = getattr(self, name)
            if not _is_number(v) or not 0.0 <= v < 1.0:
                raise bad(name, f"must be in [0, 1), got {v!r}")
        if self.grad_clip is not None and (not _is_number(self.grad_clip) or self.grad_clip <= 0):
            raise bad("grad_clip", f"must be a positive number or None, got {self.grad_clip!r}")
        if self.tpp is not None and self.total_tokens is not None:
            raise bad("tpp", "give tpp or total_tokens, not both")
        if self.tpp is not None and (not _is_number(self.tpp) or self.tpp <= 0):
            raise bad("tpp", f"must be a positive number, got {self.tpp!r}")
        if self.total_tokens is not None and not _is_positive_int(self.total_tokens):
            raise bad("total_tokens", f"must be a positive integer (tokens), got {self.total_tokens!r}")
        try:
            check_one_decay(self.tau is not None, self.weight_decay is not None)
        except InputError as err:
            raise bad("tau", str(err)) from None
        if self.tau is not None and (not _is_number(self.tau) or self.tau <= 0):
            raise bad("tau", f"must be a positive number (None = no weight decay), got {self.tau!r}")
        if self.weight_decay is not None and (not _is_number(self.weight_decay) or self.weight_decay < 0):
            raise bad("weight_decay", f"must be a non-negative number, got {self.weight_decay!r}")
        if self.batch_tokens % self.context:
            raise bad("batch_tokens", f"{self.batch_tokens} is not a multiple of context {self.context}")
        micro = self.micro_batch_tokens
        if micro is not None:
            if not _is_positive_int(micro):
                raise bad("micro_batch_tokens", f"must be a positive integer or None, got {micro!r}")
            if micro % self.context or self.batch_tokens % micro:
                raise bad(
                    "micro_batch_tokens",
                    f"{micro} must be a multiple of context {self.context} "
                    f"and divide batch_tokens {self.batch_tokens}",
                )
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise bad("device", f"must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.dtype == "bfloat16" and self.device == "cpu":
            raise bad("dtype", "bfloat16 autocast is a CUDA option; use float32 on CPU")
        if self.compile and self.device == "cpu":
            raise bad("compile", "torch.compile is a CUDA option here; set compile=False on CPU")
        if self.threads is not None and not _is_positive_int(self.threads):
            raise bad("threads", f"must be a positive integer or None, got {self.threads!r}")
        if not isinstance(self.corpus, str) or not self.corpus:
            raise bad("corpus", "must be 'stdlib' or a path")
        if not _is_positive_int(self.val_tokens):
            raise bad("val_tokens", f"must be a positive integer, got {self.val_tokens!r}")
        if self.report_every_tokens is not None and not _is_positive_int(self.report_every_tokens):
            raise bad(
                "report_every_tokens", f"must be a positive integer or None, got {self.report_every_tokens!r}"
            )
        if self.checkpoint_every_tokens is not None and not _is_positive_int(self.checkpoint_every_tokens):
            raise bad(
                "checkpoint_every_tokens",
                f"must be a positive integer or None, got {self.checkpoint_every_tokens!r}",
            )
        if not isinstance(self.val_fractions, tuple) or any(
            not _is_number(f) or not 0.0 < f <= 1.0 for f in self.val_fractions
        ):
            raise bad("val_fractions", f"must be fractions of training in (0, 1], got {self.val_fractions!r}")
        if (
            self.fault is not None
            and self.fault.kind == "loss_normalization"
            and self.fault.micro_batch_tokens
        ):
            m = self.fault.micro_batch_tokens
            if m % self.context or self.batch_tokens % m:
                raise bad(
                    "fault",
                    f"fault.micro_batch_tokens {m} must be a multiple of context {self.context} "
                    f"and divide batch_tokens {self.batch_tokens}",
                )

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `TrainConfig.from_dict` inverts it."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["schedule"] = self.schedule.to_dict()
        d["fault"] = None if self.fault is None else self.fault.to_dict()
        d["val_fractions"] = list(self.val_fractions)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Build from a dict of field values (e.g. a Ray Tune config); unknown keys raise InputError."""
        if not isinstance(d, dict):
            raise InputError(f"TrainConfig: expected a mapping, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InputError(f"TrainConfig: unknown field(s) {', '.join(unknown)}")
        return cls(**dict(d))


@dataclass(frozen=True)
class Plan:
    """The quantities a TrainConfig implies (all computed, none typed in).

    Attributes:
        params_non_embedding, params_total: N (non-embedding) and all parameters.
        total_tokens: D, a whole number of steps; steps = D / batch_tokens.
        tpp: actual D/N. requested_total_tokens: tpp·N or the given total_tokens, before rounding to steps.
        micro_batch_tokens: tokens per micro-batch (before a fault's restart); accumulation = B / micro.
        weight_decay: λ of the hidden matrices (0 = none); tau: B/(ηλD) (None = no weight decay).
        m_n, m_l: CompleteP width and depth multipliers. base_lr: η·m_N (embeddings, unembedding, LayerNorm).
        report_every_tokens, checkpoint_every_tokens: cadences in tokens (whole steps).
    """

    params_non_embedding: int
    params_total: int
    total_tokens: int
    requested_total_tokens: float
    steps: int
    tpp: float
    micro_batch_tokens: int
    weight_decay: float
    tau: float | None
    m_n: float
    m_l: float
    base_lr: float
    report_every_tokens: int
    checkpoint_every_tokens: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the plan."""
        return dataclasses.asdict(self)


def _round_up_to_steps(tokens: int, batch_tokens: int) -> int:
    return max(1, math.ceil(tokens / batch_tokens)) * batch_tokens


def plan(config: TrainConfig) -> Plan:
    """Derive N, D, steps, λ/τ and the multipliers of ``config`` (no torch, nothing built)."""
    n, total = count_parameters(
        config.width,
        config.depth,
        config.heads,
        vocab_size=config.vocab_size,
        mlp=config.mlp,
        mlp_ratio=config.mlp_ratio,
    )
    b = config.batch_tokens
    if config.total_tokens is not None:
        requested: float = float(config.total_tokens)
    else:
        requested = (config.tpp if config.tpp is not None else 20.0) * n
    steps = max(1, round(requested / b))
    d = steps * b
    lam, tau = derive_decay(b, config.lr, d, tau=config.tau, weight_decay=config.weight_decay)
    m_n = config.width / config.base_width
    m_l = config.depth / config.base_depth
    report = config.report_every_tokens or max(1, d // 100)
    ckpt = config.checkpoint_every_tokens or max(1, d // 10)
    return Plan(
        params_non_embedding=n,
        params_total=total,
        total_tokens=d,
        requested_total_tokens=requested,
        steps=steps,
        tpp=d / n,
        micro_batch_tokens=config.micro_batch_tokens or b,
        weight_decay=lam,
        tau=tau,
        m_n=m_n,
        m_l=m_l,
        base_lr=config.lr * m_n,
        report_every_tokens=_round_up_to_steps(report, b),
        checkpoint_every_tokens=_round_up_to_steps(ckpt, b),
    )
