"""Should the pruner judge a trial against its forecast before early alignment can? (issue 14, last bullet)

    .venv/bin/python studies/bench/forecast_gate.py [--orders 20] [--workers 4]

The candidate rule ("gate"): before the collapse pruner's ``min_fraction`` (0.1), stop a trial whose loss at a
report is above the forecast's 90% band (``collapse-hpo forecast`` for the trial's N, D, τ and schedule) by
more than the pruner's ``margin`` (DEFAULT_MARGIN, chosen in BENCHMARKS.md §6; nothing is chosen here); from
``min_fraction`` on, our pruner decides as before. The forecast comes from the set's collapse family *without
the sweep's width* (its other widths, 2 seeds, τ held at 20 TPP): calibrate with sizes, then the law.

Replayed on the τ-held and λ-fixed LR and batch sweeps of both sets of studies/bench/pruning_rule.py (dev
25K, eval 99K), same orders and workers, against our pruner with its defaults. The gate is kept only if it
lowers compute at equal regret (and never cuts the best trial more often).
"""

from __future__ import annotations

import argparse
import csv
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pruning_rule import DEV, EVAL, FAMILIES, Dataset, ours, run_replays, sweeps  # noqa: E402

from collapse_hpo.hpo.rule.decision import DEFAULT_MARGIN  # noqa: E402
from collapse_hpo.predictors.calibrate import calibrate  # noqa: E402
from collapse_hpo.predictors.curves import read_curves_csv  # noqa: E402
from collapse_hpo.predictors.forecast import forecast  # noqa: E402

MIN_FRACTION = 0.1


def _runs(ds: Dataset) -> dict[str, dict[str, str]]:
    with open(ds.runs, newline="") as fh:
        return {r["run"]: r for r in csv.DictReader(fh)}


def reference(ds: Dataset, sweep_width: str):
    """Surrogate + law calibrated on the collapse family's widths other than ``sweep_width``."""
    table = _runs(ds)
    curves = [c for c in read_curves_csv(ds.curves["collapse_tau"]) if table[c.run]["width"] != sweep_width]
    for c in curves:
        c.params = float(table[c.run]["params_non_embedding"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(curves, folds=5)
    return cal.surrogate, sorted({table[c.run]["width"] for c in curves}, key=int)


class Gate:
    """Our pruner with the forecast gate in front of it (the ReplayPruner protocol of
    hpo/replays/replay.py)."""

    def __init__(self, inner, ceilings: dict[str, np.ndarray], margin: float):
        self.inner = inner
        self.name = "collapse+forecast-gate"
        self.ceilings = ceilings  # run -> the forecast band's high on the sweep grid
        self.margin = margin

    def new_sweep(self, sweep, seed: int) -> None:
        self.sweep = sweep
        self.inner.new_sweep(sweep, seed)

    def start(self, trial: int) -> None:
        self.inner.start(trial)

    def report(self, trial: int, index: int) -> bool:
        stop = self.inner.report(trial, index)
        sw = self.sweep
        if sw.grid[index] < MIN_FRACTION:
            ceiling = self.ceilings[sw.curves[trial].run][index]
            stop = stop or bool(sw.losses[trial, index] > ceiling * (1.0 + self.margin))
        return stop

    def finish(self, trial: int, pruned: bool) -> None:
        self.inner.finish(trial, pruned)


def ceilings_for(sw, surrogate, n_params: float) -> dict[str, np.ndarray]:
    """The forecast band's high for each trial of ``sw`` on the sweep's report grid."""
    out = {}
    for c in sw.curves:
        fc = forecast(surrogate, n_params, c.tpp * n_params, schedule=c.schedule, tau=c.tau,
                      t_hat=np.clip(sw.grid, 1e-3, 1.0))
        out[c.run] = fc.loss_high
    return out


def diagnose(ds: Dataset) -> None:
    """The forecast itself at CPU scale: the family's held-out width (same LR rule as the reference widths)
    against its actual finals, and the shape before t̂ = 0.2 (actual / forecast loss of that run)."""
    table = _runs(ds)
    sw = sweeps(ds, "lr_tau")[0]
    width = table[sw.curves[0].run]["width"]
    surrogate, ref_widths = reference(ds, width)
    held = [c for c in read_curves_csv(ds.curves["collapse_tau"]) if table[c.run]["width"] == width]
    if surrogate.scaling_law is None or not held:
        return
    n = float(table[held[0].run]["params_non_embedding"])
    for c in held:
        grid = np.array([0.01, 0.05, 0.09, 0.2, 0.5, 1.0])
        fc = forecast(surrogate, n, c.tpp * n, schedule=c.schedule, tau=c.tau, t_hat=grid)
        actual = np.interp(grid, c.t_hat, c.loss)
        ratios = " ".join(f"{t:g}:{a / f:.3f}" for t, a, f in zip(grid, actual, fc.loss))
        inside = fc.low <= c.final_loss <= fc.high
        print(f"{ds.name.split()[0]} {c.run} (width {width} from widths {', '.join(ref_widths)}): final "
              f"forecast {fc.final_loss:.4f} [{fc.low:.4f}, {fc.high:.4f}] actual {c.final_loss:.4f} "
              f"({100 * (fc.final_loss / c.final_loss - 1):+.1f}%, inside {inside}); actual/forecast "
              f"at t_hat {ratios}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    print(f"gate margin {DEFAULT_MARGIN:g} (the pruner's default), before t_hat {MIN_FRACTION:g}; "
          f"{args.orders} orders, {args.workers} workers")
    for ds in (DEV, EVAL):
        diagnose(ds)
    print(f"{'sweep':<22} {'pruner':<24} {'compute':>8} {'regret':>8} {'best cut':>8} {'gate stops':>10}")
    verdicts = []
    for ds in (DEV, EVAL):
        table = _runs(ds)
        for fam in FAMILIES:
            for sw in sweeps(ds, fam):
                width = table[sw.curves[0].run]["width"]
                n_params = float(table[sw.curves[0].run]["params_non_embedding"])
                surrogate, ref_widths = reference(ds, width)
                if surrogate.scaling_law is None:
                    print(f"{ds.name} {sw.name}: no law from widths {ref_widths}; skipped")
                    continue
                ceil = ceilings_for(sw, surrogate, n_params)
                base = ours("collapse", surrogate)

                def gated(base=base, ceil=ceil):
                    return Gate(base(), ceil, DEFAULT_MARGIN)

                sums = run_replays(sw, [base, gated], args.orders, args.workers)
                early = sum(
                    bool(np.any(sw.losses[i, sw.grid < MIN_FRACTION]
                                > ceil[c.run][sw.grid < MIN_FRACTION] * (1 + DEFAULT_MARGIN)))
                    for i, c in enumerate(sw.curves)
                )
                label = f"{ds.name.split()[0]} {sw.name}"
                for s in sums:
                    print(f"{label:<22} {s.pruner:<24} {s.compute:>8.3f} {s.relative_regret:>8.3%} "
                          f"{s.best_pruned_rate:>8.2f} {early if s.pruner != 'collapse' else '':>10}")
                a, b = sums
                verdicts.append((label, b.compute - a.compute, b.relative_regret - a.relative_regret,
                                 b.best_pruned_rate - a.best_pruned_rate, early, sw.n_trials))
    print("\n# gate minus pruner alone: compute, regret, best-cut rate (trials above the band before 0.1)")
    for label, dc, dr, db, early, n in verdicts:
        print(f"{label:<22} {dc:+.3f} {dr:+.3%} {db:+.2f}  ({early} of {n} trials)")
    lower = all(dc <= 0 for _, dc, *_ in verdicts) and any(dc < 0 for _, dc, *_ in verdicts)
    equal = all(dr <= 1e-12 and db <= 0 for _, _, dr, db, *_ in verdicts)
    print(f"\nkeep the gate? lowers compute: {lower}; equal regret and best-cut rate: {equal} -> "
          f"{'KEEP' if lower and equal else 'DROP'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
