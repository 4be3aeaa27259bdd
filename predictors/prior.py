"""A prior surrogate, tested on a sweep's own partial curves: predictions before any trial has finished.

An online reference (hpo/rule/reference.py) calibrates on the sweep's completed trials, so until
``min_trials`` have finished it has nothing to predict with. The prior fills that gap: a surrogate that exists
before the sweep (``BUILTIN_PRIOR``, calibrated on the development collapse family, or any calibrated JSON),
whose shape is checked against the sweep's own curves as far as they go.

The check (``prior_for_sweep``): each curve that reached t̂ = R ≥ ``MIN_REACH`` (running, pruned or complete)
is predicted from its first half, f = R/2, with the prior, and the level the prior then expects over its last
stretch [0.75·R, R] is compared with the level it reported: u = log(observed/expected) / ln(R/f), the prior's
shape miss per unit of ln t̂ on this sweep. A final-loss prediction from the first p of training extrapolates
the shape over ln(1/p); the prior's learned error band at p is widened by that:

    scale(p)² = scale_prior(p)² + (SHAPE_MISS_WEIGHT · U · ln(1/p))²,   U = √(mean u²) over the tested curves,

and its Student-t count is the two terms' pooled count (``pooled_count``: Welch–Satterthwaite's degrees of
freedom of a sum of two variances, one learned on the prior's n groups, the other on the m tested curves),
which follows the term that dominates: the prior's count where its own error does, the tested curves' where
the shape miss does. (Until BENCHMARKS §36 it was the smaller of the two counts: on a sweep the prior's shape
misses, its 4 folds set a t quantile of 2.35 on a width that 16 tested curves had measured.) A sweep whose
curves follow the prior's shape keeps the prior's interval; one whose curves do not (other controls than
the prior's, another trainer) gets an interval as wide as the misses say. Until a curve reaches ``MIN_REACH``
the prior is used untested, and says so in its label.

``pair_bands`` (the prior's paired errors, learned on its own family) serve only a sweep whose curves the
prior's shape fits as well as it fits that family: once at least ``PAIR_MIN_TESTED`` curves tested it and
their shape miss U is at most the family's own (``info["family_shape_miss"]``: U of the prior on its
calibration curves, 0.0579 for the builtin prior; a prior without it never keeps them). Otherwise a comparison
of trials with other controls uses the (widened) interval instead: on our random configs (U 0.16–0.19),
surestop_lora (0.14) or a synthetic MLP task (0.22) the pairs the prior learned say nothing; on LR and batch
sweeps of the prior's own trainer with λ fixed (U 0.02–0.04) they are the calibrated reference's, and the
paired comparison cut 0.05–0.15 of the compute there with every best kept (BENCHMARKS §32).

Each error band's ``bias`` (its family's mean miss at that fraction) is not applied as a shift on a sweep the
prior was not fitted on: the interval becomes the union of the prior's interval (shifted by the bias) and the
same interval centred on the prediction (at ``BIAS_CONFIDENCE``: centre at bias/2, half-width + |bias|/2), so
it always holds the prediction. The builtin prior's bias is −0.227 at t̂ 0.1, −0.083 at 0.15 and within ±0.03
from 0.2 (its shape was fitted from t̂ 0.2, so early fractions extrapolate it back); on other sweeps its mean
miss at 0.15 runs from −11% to +17% (BENCHMARKS §31). As a shift it put a trial's pessimistic bound 6–9%
*below* its own prediction at t̂ 0.1, and the unpaired comparison of a trial far along with such a bound cut
the best of a real architecture sweep in 6 of 20 orders (gemstones, 22 shapes).

The interval *shown* for a prediction with the prior reaches up to at least the trial's current loss
(``info["shown_high_at_current"]``, ``Prediction.high_at_current``): a run that stalls (a too-high LR, the
quickstart's trials at LR 0.1–0.18) follows the early shape of a run that does not, so from the first 10% of
its curve no prior can say it will improve; the quickstart's early prunes showed intervals 10–30% below their
true final loss. The rule keeps the learned interval (``rule_low``/``rule_high``): no decision moves.

``SHAPE_MISS_WEIGHT`` was chosen on the development sweeps (studies/bench/artifacts: the LR and batch sweeps
with τ held and λ fixed, and the random-config sweeps) as the smallest weight of 0.25, 0.35, 0.5, 0.7, 1
whose shown intervals covered ≥ 90% of the true final losses in every family, with 3 leading curves at reach
0.4–1 (``studies/bench/online_reference.py``, part 1; BENCHMARKS.md, "Online reference"). ``MIN_REACH`` = 0.3
was set beforehand: a test from t̂ = 0.1 (R = 0.2) measures the prior's fit of the warm-up's end more than
its shape. Out of sample: the external sweeps of the same script's part 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.predict import predict_final_loss, t_quantile
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

#: The builtin prior's name in specs and labels.
BUILTIN = "builtin"
#: The builtin prior: ``calibrate`` at its defaults on
#: studies/bench/artifacts/curves_collapse_{tau,lambda}_full.csv (14 runs of the project's trainer at 20 TPP,
#: τ 0.04–0.18, 4 held-out groups), shipped with the package
#: (tests/test_online_reference.py::test_the_builtin_prior_is_its_familys_calibration recalibrates it).
BUILTIN_PRIOR = Path(__file__).resolve().parent / "data" / "builtin_prior.json"
#: On a sweep the prior was not fitted on, its interval at this confidence (the rule's default) is exactly the
#: union of its interval shifted by its family's bias and the same interval centred on the prediction; at
#: other confidences it is close to it (``prior_for_sweep``).
BIAS_CONFIDENCE = 0.9
#: A tested prior keeps its paired errors only once at least this many of the sweep's curves tested it (set
#: a priori: one or two curves can fit the prior's shape by chance).
PAIR_MIN_TESTED = 3
#: A curve tests the prior once it reached this t̂ (it is predicted from its first half).
MIN_REACH = 0.3
#: Reaches are rounded down to multiples of this (t̂) before a test, so the tested prior changes only when a
#: curve crosses one: few distinct tests per sweep, each named by its inputs (``SweepPrior.label``).
REACH_STEP = 0.05
#: Weight of the measured shape miss in the widened interval (see the module docstring).
SHAPE_MISS_WEIGHT = 0.5
#: At most this many curves (the furthest-reaching) test the prior: bounds the cost of a test.
MAX_TESTED = 16


@lru_cache(maxsize=4)
def _load(path: str) -> Surrogate:
    return Surrogate.load(path)


def load_prior(spec: str | Path | Surrogate) -> tuple[Surrogate, str]:
    """The prior surrogate and its name: ``"builtin"`` (``BUILTIN_PRIOR``), a surrogate JSON path, or a
    ``Surrogate``. Raises InputError when the file cannot be read."""
    if isinstance(spec, Surrogate):
        return spec, "surrogate"
    if str(spec) == BUILTIN:
        return _load(str(BUILTIN_PRIOR)), BUILTIN
    return _load(str(Path(spec).expanduser())), f"file:{Path(spec).name}"


@dataclass(frozen=True)
class SweepPrior:
    """A prior with its error bands widened by the sweep's own shape misses.

    Attributes:
        surrogate: the prior with the widened ``error_bands`` and no ``pair_bands``.
        tested: (name, reach) of each curve that tested it (reach rounded down to ``REACH_STEP``).
        miss: U, the root mean square shape miss per unit of ln t̂ (0 when untested).
    """

    surrogate: Surrogate
    tested: tuple[tuple[str, float], ...]
    miss: float


def rounded_reach(t_hat: float) -> float:
    """How far a run has got, ``t_hat`` (at most 1) rounded down to a multiple of ``REACH_STEP``."""
    return math.floor(min(t_hat, 1.0) / REACH_STEP + 1e-9) * REACH_STEP


def reaching_curves(curves: Sequence[Curve]) -> list[tuple[Curve, float]]:
    """The curves that can test the prior, each with its reach rounded down to ``REACH_STEP``: at most
    ``MAX_TESTED``, the furthest-reaching first (ties: by name), in a deterministic order."""
    out = []
    for c in curves:
        ok = np.isfinite(c.loss) & (c.loss > 0)
        if not ok.any():
            continue
        reach = rounded_reach(float(c.t_hat[ok].max()))
        if reach >= MIN_REACH - 1e-9:
            out.append((c, round(reach, 6)))
    out.sort(key=lambda cr: (-cr[1], cr[0].run))
    return out[:MAX_TESTED]


def shape_miss(prior: Surrogate, curve: Curve, reach: float) -> float | None:
    """u: the prior's miss of ``curve``'s level over [0.75·reach, reach] predicted from its first reach/2, per
    unit of ln t̂ (log units); None when the prior cannot predict the curve."""
    ok = np.isfinite(curve.loss) & (curve.loss > 0) & (curve.t_hat <= reach + 1e-9)
    t, y = curve.t_hat[ok], curve.loss[ok]
    f = reach / 2.0
    early = t <= f + 1e-9
    pred = predict_final_loss(t[early], y[early], surrogate=prior, schedule=curve.schedule, tau=curve.tau,
                              tpp=curve.tpp, min_fraction=min(0.1, f))
    late = t >= 0.75 * reach - 1e-9
    if not pred.ok or not late.any():
        return None
    try:
        shape = prior.normalized(t[late], curve.schedule, curve.tau, curve.tpp)
    except (InputError, ValueError):
        return None
    expected = float(np.mean(np.log(pred.final_loss * shape)))
    observed = float(np.mean(np.log(y[late])))
    if not (math.isfinite(expected) and math.isfinite(observed)):
        return None
    return (observed - expected) / math.log(reach / f)


#: Shape misses a memo of ``_memoized_miss`` keeps before it is emptied: each key holds a curve's points up
#: to its reach (~1 KB for 50 reports), one per trial and reach step it was tested at (~3,000 for 200
#: trials), so a memo stays below ~10 MB.
MISS_MEMO_SIZE = 10_000


def _memoized_miss(
    memo: dict[tuple, float | None], prior: Surrogate, curve: Curve, reach: float
) -> float | None:
    """``shape_miss(prior, curve, reach)`` from ``memo``, keyed by everything it reads: the curve's points up
    to ``reach`` (their bytes, in their order), its schedule and controls. A running trial's next version,
    whose new reports lie past its rounded reach, hits: the online reference tests a fit on a new set of
    reaching curves at every step of any one, and most others have moved on by a report since."""
    keep = curve.t_hat <= reach + 1e-9
    key = (reach, curve.schedule, curve.tau, curve.tpp, curve.t_hat[keep].tobytes(),
           curve.loss[keep].tobytes())
    if key in memo:
        return memo[key]
    if len(memo) >= MISS_MEMO_SIZE:
        memo.clear()
    u = memo[key] = shape_miss(prior, curve, reach)
    return u


def _family_miss(prior: Surrogate) -> float | None:
    """The prior's shape miss on its own calibration family (``info["family_shape_miss"]``), or None when it
    does not record a non-negative finite number (a hand-made prior JSON): then it never lends its paired
    errors."""
    value = prior.info.get("family_shape_miss")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def pooled_count(prior_scale: float, prior_n: int, extra: float, tested: int) -> int:
    """The Student-t count of a band whose variance is the prior's (``prior_scale``², learned from
    ``prior_n`` independent units: ν₁ = prior_n − 1 degrees of freedom) plus the shape miss's (``extra``²,
    the root mean square of ``tested`` curves' misses about zero: ν₂ = tested). Welch–Satterthwaite:
    ν = (s₁² + s₂²)² / (s₁⁴/ν₁ + s₂⁴/ν₂), rounded down, as a count ν + 1, between 2 and the larger of the
    two counts. ν is ν₁ when the prior's term is all (``extra`` 0) and ν₂ when the miss is.

    >>> from collapse_hpo.predictors.prior import pooled_count
    >>> pooled_count(0.036, 4, 0.0, 16), pooled_count(0.036, 4, 0.0707, 16), pooled_count(0.036, 4, 0.002, 16)
    (4, 17, 4)
    """
    v1, v2 = max(prior_n - 1, 1), max(tested, 1)
    a, b = prior_scale**2, extra**2
    denom = a * a / v1 + b * b / v2
    nu = (a + b) ** 2 / denom if denom > 0 else float(v1)
    return max(2, min(math.floor(nu + 1e-9) + 1, max(prior_n, tested + 1)))


def prior_for_sweep(
    prior: Surrogate, curves: Sequence[Curve], *, weight: float = SHAPE_MISS_WEIGHT, own: bool = False,
    memo: dict[tuple, float | None] | None = None,
) -> SweepPrior:
    """The prior tested on the sweep's curves (module docstring); deterministic for given curves.

    ``own``: the surrogate was fitted on this sweep (an online fit, tested on the sweep's curves it was not
    fitted on): its paired errors and size trend were learned on the sweep, and are kept.
    ``memo``: ``shape_miss`` of ``prior`` by what it reads of a curve (``_memoized_miss``), kept by a caller
    that tests this one prior again as the sweep's curves move on (one at a time): an online reference
    (hpo/rule/reference.py).
    """
    tested = []
    misses = []
    for c, reach in reaching_curves(curves):
        u = shape_miss(prior, c, reach) if memo is None else _memoized_miss(memo, prior, c, reach)
        if u is not None:
            tested.append((c.run, reach))
            misses.append(u)
    miss = float(math.sqrt(np.mean(np.square(misses)))) if misses else 0.0
    bands = []
    for b in prior.error_bands:
        extra = weight * miss * math.log(1.0 / b.fraction)
        n = pooled_count(b.scale, b.n, extra, len(misses)) if misses else b.n
        scale = math.sqrt(b.scale**2 + extra**2)
        bias = b.bias
        if not own:  # an own fit keeps the bias it learned here; the prior's, from its family, widens
            bias = b.bias / 2
            scale += abs(b.bias) / (2 * t_quantile(BIAS_CONFIDENCE, n) * math.sqrt(1 + 1 / n))
        bands.append(ErrorBand(fraction=b.fraction, n=n, bias=bias, scale=scale,
                               max_abs=max(b.max_abs, scale), fit_residual=b.fit_residual))
    info = {**prior.info, "prior_tested_on": [f"{r}@{x:g}" for r, x in tested], "prior_shape_miss": miss}
    if own:
        surrogate = replace(prior, error_bands=bands, info=info)
    else:
        # The size trend would replace the widened band for a run with a known size: the prior's size model
        # was learned on its own family, so it is dropped. Its paired errors serve a sweep its shape fits as
        # well as its own family (module docstring).
        family = _family_miss(prior)
        pairs = family is not None and len(misses) >= PAIR_MIN_TESTED and miss <= family
        surrogate = replace(prior, error_bands=bands, pair_bands=prior.pair_bands if pairs else [],
                            size_trend=[], info={**info, "shown_high_at_current": True})
    return SweepPrior(surrogate=surrogate, tested=tuple(tested), miss=miss)
