"""Benchmark: do the prediction intervals shown on screen hold the true final loss? (issue 13, item 3)

Three parts, one command (``.venv/bin/python studies/bench/shown_intervals.py``):

1. **choice** (development curves only): the reference surrogate is calibrated on our collapse families
   (studies/bench/artifacts/curves_collapse_{tau,lambda}_full.csv); every curve of our CPU sweeps is predicted
   from its first p of training, p = 0.10, 0.14, ..., 0.58. Collapsing predictions: the LR and batch sweeps
   and the clean alarm runs. Non-collapsing: the faulty alarm runs after their fault (t̂ > 0.4; strength 1 and
   0.5) and the high-LR runs (``curves_lr_high_full.csv``, LR 0.1 to 1.0, beyond the sweeps' range). For
   each candidate ``MISFIT_LIMIT`` it prints the share flagged "does not collapse" and the coverage of the
   shown intervals; the chosen limit is the smallest that flags at most 1% of the collapsing predictions.
2. **replay** (development sweeps, trained to the end, so the truth is known): every sweep of section 5 of
   BENCHMARKS.md (each seed alone) plus ``lr_high`` (the LR sweep of seed 0 with the high-LR runs added) is
   replayed through the ``collapse`` and ``collapse-online`` pruners (hpo/replays/replay.py, 4 workers, 50
   reports). For every prune decision with a prediction: is the true final loss inside the interval shown
   *before* this change (the learned band, which the decision rule still uses: ``rule_low``..``rule_high``)
   and *after* (``predicted_low``..``predicted_high``)? And how many were flagged?
3. **external** (out of sample, never used for a choice): the same count on the mpl_luo2025 schedule sweeps
   (reference: the other sizes) and qiu_supercollapse chess (collapse-online only), read from
   ../shared/extdata by path when it is there.

``--train`` first trains the high-LR runs (6 runs of the sweep model, ~2 min each on one core) into
``--cache`` and writes ``artifacts/curves_lr_high_full.csv``; without it the committed file is used.
Prints every figure and writes ``artifacts/shown_intervals.md`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from collapse_hpo.hpo.replays import peers
from collapse_hpo.hpo.replays.replay import Sweep, make_sweep, random_orders, simulate
from collapse_hpo.hpo.rule.record import read_log
from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import Curve, read_curves_csv, write_curves_csv
from collapse_hpo.predictors.misfit import MISFIT_LIMIT, shown_interval
from collapse_hpo.predictors.predict import predict_final_loss

ART = Path(__file__).resolve().parent / "artifacts"
EXTDATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "extdata"
SWEEPS = ("lr_tau", "lr_lambda", "bs_tau", "bs_lambda")
HIGH_LRS = (0.1, 0.16, 0.25, 0.4, 0.6, 1.0)  # hidden-matrix peak LRs at width 64 (the sweeps end at 0.06)
LIMITS = (1.5, 2.0, 2.5, 3.0)
FRACTIONS = tuple(np.round(np.arange(0.10, 0.60, 0.04), 2))
FAULT_T_HAT = 0.4
REPORTS = 50
WORKERS = 4


def log(msg: str) -> None:
    print(msg, flush=True)


def _family(name: str) -> list[Curve]:
    return read_curves_csv(ART / f"curves_{name}_full.csv")


def _seed(c: Curve) -> int:
    return int(c.run.rsplit("_", 2)[-2].removeprefix("s"))


def reference():
    """The reference surrogate of section 5: calibrated on the 14 collapse-family runs (5 held-out folds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibrate(_family("collapse_tau") + _family("collapse_lambda"), folds=5).surrogate


# ------------------------------------------------------------------------------------------------ training
def train_high(cache: Path) -> None:
    """Train the high-LR runs (the LR sweep's model and τ, seed 0) and write curves_lr_high_full.csv."""
    from evidence_train import SIZES, TAU_OPT, RunSpec, _base, _shape, load_family, run_plan

    size = SIZES["full"]
    runs = [
        RunSpec("lr_high", f"lr_high_s0_{i:02d}",
                {**_base(size, **_shape(size.sweep_width, size.depth), lr=lr, seed=0), "tau": TAU_OPT},
                meta={"lr": lr, "seed": 0})
        for i, lr in enumerate(HIGH_LRS)
    ]
    failed = run_plan(runs, cache, workers=1, log=log)
    if failed:
        raise SystemExit(f"training failed: {failed}")
    write_curves_csv(ART / "curves_lr_high_full.csv", load_family(cache, "lr_high"))


# ------------------------------------------------------------------------------------------------ 1. choice
def predictions(surrogate, curves: Iterable[Curve], after: float = 0.0) -> list[dict[str, Any]]:
    """Every prediction of each curve from its first p ∈ FRACTIONS (p > ``after``), with the truth."""
    rows = []
    for c in curves:
        ok = np.isfinite(c.loss)
        t, y = c.t_hat[ok], c.loss[ok]
        for p in FRACTIONS:
            if p <= after:
                continue
            keep = t <= p + 1e-9
            pr = predict_final_loss(t[keep], y[keep], surrogate=surrogate, schedule=c.schedule, tau=c.tau,
                                    tpp=c.tpp)
            if pr.ok and pr.low is not None and math.isfinite(c.final_loss):
                rows.append({"pred": pr.final_loss, "low": pr.low, "high": pr.high, "misfit": pr.misfit,
                             "current": pr.current_loss, "lowest": pr.lowest_loss, "final": c.final_loss})
    return rows


def _shown(r: dict[str, Any], limit: float) -> tuple[float, float]:
    """The shown interval of a prediction row with the limit ``limit`` (the rule of predictors/misfit.py)."""
    lo, hi = shown_interval(r["pred"], r["low"], r["high"], r["misfit"], r["current"], r["lowest"],
                            limit=limit)
    return float(lo), float(hi)


def _cover(rows: list[dict[str, Any]], limit: float) -> float:
    if not rows:
        return math.nan
    return float(np.mean([lo <= r["final"] <= hi for r in rows for lo, hi in [_shown(r, limit)]]))


def _flagged(rows: list[dict[str, Any]], limit: float) -> list[dict[str, Any]]:
    return [r for r in rows if r["misfit"] is not None and r["misfit"] > limit]


def part_choice(surrogate, md: list[str]) -> float:
    """Part 1: the limit, chosen on development curves; returns it."""
    collapsing = predictions(surrogate, [c for f in (*SWEEPS, "alarm_clean") for c in _family(f)])
    faulty = predictions(surrogate, _family("alarm_fault") + _family("alarm_medium"), after=FAULT_T_HAT)
    high = predictions(surrogate, _family("lr_high"))
    non = faulty + high
    md += ["## 1. Choice of the limit (development curves)", "",
           f"{len(collapsing)} predictions of collapsing curves (LR and batch sweeps, clean alarm runs), "
           f"{len(non)} of curves that do not collapse ({len(faulty)} faulty runs after t̂ = 0.4, "
           f"{len(high)} high-LR runs), p = {FRACTIONS[0]:g} to {FRACTIONS[-1]:g}.", "",
           "| limit | flagged (collapsing) | flagged (not collapsing) | coverage collapsing | coverage not "
           "collapsing (all / flagged) |", "|---|---|---|---|---|"]
    log(f"choice: {len(collapsing)} collapsing and {len(non)} non-collapsing predictions")
    log(f"  learned band only: coverage collapsing {_cover(collapsing, math.inf):.3f}, "
        f"not collapsing {_cover(non, math.inf):.3f}")
    chosen = math.nan
    for limit in LIMITS:
        fc, fn = len(_flagged(collapsing, limit)) / len(collapsing), len(_flagged(non, limit)) / len(non)
        cov_f = _cover(_flagged(non, limit), limit)
        line = (f"  limit {limit:g}: flagged {fc:.3f} of collapsing, {fn:.2f} of non-collapsing; coverage "
                f"collapsing {_cover(collapsing, limit):.3f}, non-collapsing {_cover(non, limit):.2f} "
                f"(flagged ones {cov_f:.2f})")
        log(line)
        md.append(f"| {limit:g} | {fc:.3f} | {fn:.2f} | {_cover(collapsing, limit):.3f} | "
                  f"{_cover(non, limit):.2f} / {cov_f:.2f} |")
        if math.isnan(chosen) and fc <= 0.01:
            chosen = limit
    md += ["", f"Learned band alone: coverage {_cover(collapsing, math.inf):.3f} (collapsing), "
           f"{_cover(non, math.inf):.2f} (not collapsing). Chosen: **{chosen:g}** (the smallest limit that "
           f"flags at most 1% of the collapsing predictions); `MISFIT_LIMIT` = {MISFIT_LIMIT:g}.", ""]
    log(f"  chosen limit {chosen:g} (MISFIT_LIMIT in predictors/misfit.py: {MISFIT_LIMIT:g})")
    return chosen


# ------------------------------------------------------------------------------------------ 2./3. replays
def prune_entries(sweep: Sweep, pruner: str, surrogate, orders: int, *, all_prunes: bool = False
                  ) -> list[dict[str, Any]]:
    """Every prune decision with a prediction in ``orders`` replays: the intervals before/after, the truth,
    the reference label. ``all_prunes``: also the prunes without a prediction (their intervals are None)."""
    out = []
    for k, order in enumerate(random_orders(sweep.n_trials, orders, seed=0)):
        adapter = peers.factory(pruner, surrogate=surrogate)()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            simulate(sweep, adapter, order, workers=WORKERS, seed=k)
        out += replay_prunes(sweep, adapter, all_prunes=all_prunes)
    return out


def replay_prunes(sweep: Sweep, adapter: Any, *, all_prunes: bool = False) -> list[dict[str, Any]]:
    """The prune decisions with a prediction of one finished replay of ``sweep`` (``adapter``: the replay's
    ``peers.OptunaAdapter``, its study holding the decision logs), as ``prune_entries`` lists them."""
    out = []
    index = {c.run: i for i, c in enumerate(sweep.curves)}
    for t in adapter.study.get_trials(deepcopy=False):
        final = float(sweep.finals[index[t.user_attrs["run"]]])
        for e in read_log(t.user_attrs):
            shown = e.predicted_final_loss is not None and e.rule_low is not None
            if e.prune and (all_prunes or shown):
                out.append({"final": final, "before": (e.rule_low, e.rule_high),
                            "after": (e.predicted_low, e.predicted_high), "misfit": e.misfit,
                            "flagged": e.predicted_low != e.rule_low or e.predicted_high != e.rule_high,
                            "t_hat": e.t_hat, "reference": e.reference})
    return out


def _inside(iv: tuple[float | None, float | None], x: float) -> bool:
    return iv[0] is not None and iv[1] is not None and iv[0] <= x <= iv[1]


def tally(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Coverage before/after, the share flagged, and coverage among the flagged ones."""
    n = len(entries)
    flagged = [e for e in entries if e["flagged"]]

    def cov(es: list[dict[str, Any]], key: str) -> float:
        return float(np.mean([_inside(e[key], e["final"]) for e in es])) if es else math.nan

    return {"n": n, "before": cov(entries, "before"), "after": cov(entries, "after"),
            "flagged": len(flagged) / n if n else math.nan, "n_flagged": len(flagged),
            "flagged_before": cov(flagged, "before"), "flagged_after": cov(flagged, "after")}


def _row(name: str, pruner: str, t: dict[str, float]) -> str:
    return (f"| {name} | {pruner} | {t['n']} | {t['before']:.2f} | {t['after']:.2f} | {t['flagged']:.2f} "
            f"({t['n_flagged']}) | {t['flagged_before']:.2f} → {t['flagged_after']:.2f} |")


HEAD = ["| sweep | pruner | prune decisions | coverage before | coverage after | flagged \"does not "
        "collapse\" | coverage of the flagged, before → after |", "|---|---|---|---|---|---|---|"]


def part_replay(surrogate, orders: int, online_orders: int, md: list[str]) -> None:
    """Part 2: our sweeps, trained to the end."""
    sweeps: dict[str, list[Curve]] = {}
    for fam in SWEEPS:
        for c in _family(fam):
            sweeps.setdefault(f"{fam}_s{_seed(c)}", []).append(c)
    sweeps["lr_high"] = sweeps["lr_tau_s0"] + _family("lr_high")
    md += ["## 2. Replays of our sweeps (every trial trained to the end)", "",
           f"{orders} trial orders per sweep for `collapse` (reference: the collapse families), "
           f"{online_orders} for `collapse-online`; {WORKERS} workers, {REPORTS} reports per trial. "
           "Before: the learned band (what was shown until now, and what the rule still uses); after: the "
           "interval shown now.", "", *HEAD]
    total: dict[str, list[dict[str, Any]]] = {"collapse": [], "collapse-online": []}
    for name, curves in sweeps.items():
        sweep = make_sweep(curves, n_reports=REPORTS, name=name)
        for pruner, k in (("collapse", orders), ("collapse-online", online_orders)):
            t0 = time.perf_counter()
            es = prune_entries(sweep, pruner, surrogate if pruner == "collapse" else None, k)
            total[pruner] += es
            t = tally(es)
            md.append(_row(name, pruner, t))
            log(f"replay {name:12s} {pruner:16s} {t['n']:3d} prunes: coverage {t['before']:.2f} -> "
                f"{t['after']:.2f}, flagged {t['flagged']:.2f} ({time.perf_counter() - t0:.0f} s)")
    for pruner, es in total.items():
        t = tally(es)
        md.append(_row("**all**", pruner, t))
        log(f"replay ALL {pruner}: {t['n']} prunes, coverage {t['before']:.3f} -> {t['after']:.3f}, flagged "
            f"{t['flagged']:.3f}; flagged ones {t['flagged_before']:.2f} -> {t['flagged_after']:.2f}")
    md.append("")


def part_external(extdata: Path, orders: int, online_orders: int, md: list[str]) -> None:
    """Part 3: external curves (out of sample)."""
    from evidence import mpl_curves, qiu_chess_curves

    md += ["## 3. Out of sample: external curves (../shared/extdata)", ""]
    if not extdata.is_dir():
        md += [f"{extdata} not found: part skipped.", ""]
        log(f"external: {extdata} not found, skipped")
        return
    md += HEAD
    mpl = extdata / "mpl_luo2025"
    if mpl.is_dir():
        allc = {s: mpl_curves(mpl, s) for s in (25, 100, 400)}
        for s, curves in allc.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sur = calibrate([c for z, cs in allc.items() if z != s for c in cs], folds=5).surrogate
            sweep = make_sweep(curves, n_reports=REPORTS, name=f"mpl_{s}M", source=str(mpl))
            for pruner, k in (("collapse", orders), ("collapse-online", online_orders)):
                t = tally(prune_entries(sweep, pruner, sur if pruner == "collapse" else None, k))
                md.append(_row(f"mpl_{s}M", pruner, t))
                log(f"external mpl_{s}M {pruner}: {t['n']} prunes, coverage {t['before']:.2f} -> "
                    f"{t['after']:.2f}, flagged {t['flagged']:.2f}")
    qiu = extdata / "qiu_supercollapse"
    if (qiu / "chess_curves.csv.gz").exists():
        curves, weights = qiu_chess_curves(qiu, 0)
        sweep = make_sweep(curves, n_reports=REPORTS, weights=weights, name="qiu_chess_s0", source=str(qiu))
        t = tally(prune_entries(sweep, "collapse-online", None, online_orders))
        md.append(_row("qiu_chess_s0", "collapse-online", t))
        log(f"external qiu_chess_s0 collapse-online: {t['n']} prunes, coverage {t['before']:.2f} -> "
            f"{t['after']:.2f}, flagged {t['flagged']:.2f}")
    md.append("")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", action="store_true", help="train the high-LR runs first (cached in --cache)")
    ap.add_argument("--cache", type=Path, default=Path("results/shown_intervals"))
    ap.add_argument("--orders", type=int, default=5, help="trial orders per sweep for `collapse`")
    ap.add_argument("--online-orders", type=int, default=1,
                    help="trial orders for `collapse-online` (it refits as trials complete: slower)")
    ap.add_argument("--extdata", type=Path, default=EXTDATA.resolve())
    ap.add_argument("--out", type=Path, default=ART / "shown_intervals.md")
    ap.add_argument("--skip", action="append", default=[], choices=("choice", "replay", "external"))
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.train:
        train_high(args.cache)
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python studies/bench/shown_intervals.py", *given])
    md = ["# Shown intervals: coverage on pruned trials trained to the end", "", f"Command: `{command}`", ""]
    surrogate = reference()
    if "choice" not in args.skip:
        part_choice(surrogate, md)
    if "replay" not in args.skip:
        part_replay(surrogate, args.orders, args.online_orders, md)
    if "external" not in args.skip:
        part_external(args.extdata, args.orders, args.online_orders, md)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    md.append(f"Wall time {time.time() - t0:.0f} s; finished {when}.")
    args.out.write_text("\n".join(md) + "\n")
    log(f"written {args.out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
