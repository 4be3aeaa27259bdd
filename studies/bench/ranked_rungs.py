"""Rungs ranked by the collapse-predicted final loss: does the prediction rank trials better than the raw loss
early on? (issue 20, item 2: "rungs that rank trials by their collapse-predicted final loss").

A successive-halving family whose ranking is the prediction can only beat SHA if, at the fractions where
SHA's cheap settings decide (2–20% of training), the predicted final loss puts the eventual best higher than
the loss at that fraction does. This script measures that on every sweep family of ``frontier.py``, with
the reference ``collapse`` judges each sweep with (never the sweep itself), before anything is built:

1. per fraction p: the eventual best's rank among all trials by the loss at p ("raw") and by the point
   prediction from the curve up to p ("pred", ``predict_final_loss`` with ``min_fraction`` 0.01 so that early
   fractions are predicted where the window holds 3 points), and the Spearman correlation of each with the
   final losses over all trials;
2. synchronous successive halving (every trial reaches a rung, the best 1/η by the ranking continue; rungs
   r0, r0·η, … up to the end), ranking by the raw loss and by the prediction (a trial without a prediction is
   ranked by its raw loss relative to the predicted ones: the raw ranking's place), at η = 3 and r0 = 0.05,
   0.1, 0.2: compute (share of the sweep's tokens) and regret (kept best over the true best, %). No trial
   order, no workers: the ranking's own merit, not a replay.

Reads the same files as ``frontier.py`` (``../shared/extdata/surestop_lora`` in place). Prints markdown
tables; ``--out FILE`` also writes them. About 10 s on the 2-core machine.

    nice -n 5 .venv/bin/python studies/bench/ranked_rungs.py [--family random --family lora ...]
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import frontier  # noqa: E402

from collapse_hpo.hpo.replays.replay import Sweep, spearman  # noqa: E402
from collapse_hpo.predictors.predict import predict_final_loss  # noqa: E402

FRACTIONS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
ETA = 3
FIRST_RUNGS = (0.05, 0.1, 0.2)


def grid_index(sweep: Sweep, p: float) -> int:
    """The last report at or before t̂ = p (the first report when none is)."""
    return max(0, int(np.searchsorted(sweep.grid, p + 1e-9)) - 1)


def predictions(sweep: Sweep, surrogate: object, k: int) -> np.ndarray:
    """Each trial's point prediction of its final loss from its reports up to grid index ``k`` (NaN: none)."""
    out = np.full(sweep.n_trials, np.nan)
    for i, c in enumerate(sweep.curves):
        pr = predict_final_loss(sweep.grid[: k + 1], sweep.losses[i, : k + 1], surrogate=surrogate,
                                schedule=c.schedule, tau=c.tau, tpp=c.tpp, min_fraction=0.01, confidence=0.9)
        if pr.ok:
            out[i] = pr.final_loss
    return out


def rank_of(values: np.ndarray, i: int) -> int | None:
    """1-based rank of trial ``i`` by ``values`` (lower first); None when it has no value."""
    if not np.isfinite(values[i]):
        return None
    return int(np.sum(values[np.isfinite(values)] < values[i])) + 1


def ranking_keys(raw: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Sort keys by prediction; a trial without one takes the prediction of its raw-loss neighbour below."""
    keys = pred.copy()
    missing = ~np.isfinite(keys)
    if missing.all():
        return raw.copy()
    have = np.flatnonzero(~missing)
    for i in np.flatnonzero(missing):
        below = have[raw[have] <= raw[i]]
        j = below[np.argmax(raw[below])] if below.size else have[np.argmin(raw[have])]
        keys[i] = pred[j] * raw[i] / raw[j]
    return keys


def halving(sweep: Sweep, surrogate: object, r0: float, by: str,
            cache: dict[int, np.ndarray]) -> tuple[float, float]:
    """Synchronous SHA at η = ETA from rung ``r0``, ranking ``by`` "raw" or "pred": (compute, regret %)."""
    alive = np.arange(sweep.n_trials)
    reached = np.zeros(sweep.n_trials)
    rung = r0
    while rung < 1.0 - 1e-9 and alive.size > 1:
        k = grid_index(sweep, rung)
        reached[alive] = sweep.grid[k]
        raw = sweep.losses[alive, k]
        if by == "pred":
            if k not in cache:
                cache[k] = predictions(sweep, surrogate, k)
            keys = ranking_keys(raw, cache[k][alive])
        else:
            keys = raw
        keep = max(1, math.ceil(alive.size / ETA))
        alive = alive[np.argsort(keys, kind="stable")[:keep]]
        rung *= ETA
    reached[alive] = sweep.grid[-1]
    compute = float(np.sum(reached * sweep.weights) / (sweep.grid[-1] * np.sum(sweep.weights)))
    best = float(np.min(sweep.finals))
    regret = 100.0 * (float(np.min(sweep.finals[alive])) / best - 1.0)
    return compute, regret


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    frontier.add_family_arguments(ap)
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    ranks = ["| sweep | trials | " + " | ".join(f"t̂ {p:g}: raw / pred rank (ρ raw / pred)" for p in FRACTIONS)
             + " |", "|---|---:|" + "---|" * len(FRACTIONS)]
    sha = ["| sweep | " + " | ".join(f"r0 {r:g}: raw / pred (compute, regret %)" for r in FIRST_RUNGS) + " |",
           "|---|" + "---|" * len(FIRST_RUNGS)]
    for fam in frontier.load_families(args):
        for sweep, surrogate in zip(fam.sweeps, fam.surrogates, strict=True):
            frontier.log(f"{fam.name}: {sweep.name}")
            cache: dict[int, np.ndarray] = {}
            cells = []
            for p in FRACTIONS:
                k = grid_index(sweep, p)
                if k not in cache:
                    cache[k] = predictions(sweep, surrogate, k)
                raw, pred = sweep.losses[:, k], cache[k]
                rr, pr = rank_of(raw, sweep.best), rank_of(pred, sweep.best)
                cells.append(f"{rr} / {pr if pr is not None else '-'} "
                             f"({spearman(raw, sweep.finals):.2f} / {spearman(pred, sweep.finals):.2f})")
            ranks.append(f"| {fam.name}: {sweep.name} | {sweep.n_trials} | " + " | ".join(cells) + " |")
            cells = []
            for r0 in FIRST_RUNGS:
                (c1, g1), (c2, g2) = (halving(sweep, surrogate, r0, by, cache) for by in ("raw", "pred"))
                cells.append(f"{c1:.3f}, {g1:.2f} / {c2:.3f}, {g2:.2f}")
            sha.append(f"| {fam.name}: {sweep.name} | " + " | ".join(cells) + " |")
    text = ("The eventual best's rank by the loss at t̂ (raw) and by the predicted final loss (pred), and "
            "Spearman ρ of each with the final losses:\n\n" + "\n".join(ranks)
            + f"\n\nSynchronous successive halving, η = {ETA}, ranking by raw loss / by prediction:\n\n"
            + "\n".join(sha) + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
