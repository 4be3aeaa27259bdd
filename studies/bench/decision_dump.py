"""Every decision of the collapse pruner on the evidence sweeps, as sorted JSON lines, and their sha256.

The proof that a refactoring changed no decision (issue 22): run it before and after; the hashes must match.

    .venv/bin/python studies/bench/decision_dump.py                  # prints the sha256 (about 2-4 min)
    .venv/bin/python studies/bench/decision_dump.py --out /tmp/d.jsonl   # also writes the lines

What is replayed: the 8 evidence sweeps of BENCHMARKS.md §5/§6
(``artifacts/curves_{lr,bs}_{tau,lambda}_full.csv``, each seed a sweep) × 5 random trial orders
(``hpo.replays.replay.random_orders``, seed 0) × the pruner's two comparisons (``paired``, ``interval``):
80 replays of ``CollapsePruner`` with its other defaults, 4 concurrent workers and 50 reports per
trial, driven through a real in-memory Optuna study (``peers.OptunaAdapter``). The reference is
fixed: the surrogate calibrated on the set's collapse family (``collapse_{tau,lambda}_full.csv``,
5 folds), as ``studies/bench/pruning_rule.py`` does.

One line per decision-log entry (``CollapsePruner``'s per-trial log: step, t̂, prune, reason, reference label,
predicted loss and interval, threshold, misfit), keyed by sweep, comparison, order and the trial's run name;
the lines are JSON with sorted keys, sorted, and joined by newlines. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import warnings
from pathlib import Path

from collapse_hpo.hpo.optuna_side.pruner import trial_decisions
from collapse_hpo.hpo.replays import peers
from collapse_hpo.hpo.replays.replay import make_sweep, random_orders, simulate
from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import read_curves_csv

ART = Path(__file__).resolve().parent / "artifacts"
FAMILIES = ("lr_tau", "bs_tau", "lr_lambda", "bs_lambda")
COMPARISONS = ("paired", "interval")
ORDERS = 5
WORKERS = 4
REPORTS = 50


class _Recorder(peers.OptunaAdapter):
    """The replay's Optuna adapter, keeping each study so its trials' decision logs can be read after."""

    def decisions(self) -> list[tuple[str, list[dict]]]:
        """(run name, decision log) of every trial of the last replay."""
        return [(t.user_attrs["run"], trial_decisions(t)) for t in self.study.get_trials(deepcopy=False)]


def sweeps() -> list:
    """The 8 evidence sweeps: one sweep per family and seed (run names ``<family>_s<seed>_<i>``)."""
    out = []
    for family in FAMILIES:
        path = ART / f"curves_{family}_full.csv"
        curves = read_curves_csv(path)
        for seed in sorted({c.run.split("_")[2] for c in curves}):
            sel = [c for c in curves if c.run.split("_")[2] == seed]
            out.append(make_sweep(sel, n_reports=REPORTS, name=f"{family}_{seed}", source=str(path)))
    return out


def dump() -> list[str]:
    """The sorted JSON lines of every decision of the 80 replays."""
    ref = read_curves_csv(ART / "curves_collapse_tau_full.csv") + read_curves_csv(
        ART / "curves_collapse_lambda_full.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        surrogate = calibrate(ref, folds=5).surrogate
    lines: list[str] = []
    for sw in sweeps():
        for comparison in COMPARISONS:
            for k, order in enumerate(random_orders(sw.n_trials, ORDERS, seed=0)):
                name = f"collapse-{comparison}"
                rec = _Recorder(name, lambda _s, c=comparison: _pruner(surrogate, c),
                                setup_trial=peers._set_controls)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    simulate(sw, rec, order, workers=WORKERS, seed=k)
                for run, log in rec.decisions():
                    for entry in log:
                        key = {"sweep": sw.name, "comparison": comparison, "order": k, "run": run}
                        lines.append(json.dumps({**key, **entry}, sort_keys=True))
            print(f"{sw.name} {comparison}: {len(lines)} decisions so far", file=sys.stderr, flush=True)
    return sorted(lines)


def _pruner(surrogate, comparison: str):
    from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner

    return CollapsePruner(reference=surrogate, comparison=comparison)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the JSON lines here")
    args = ap.parse_args()
    text = "\n".join(dump()) + "\n"
    if args.out:
        args.out.write_text(text)
    print(f"{text.count(chr(10))} decisions, sha256 {hashlib.sha256(text.encode()).hexdigest()}")


if __name__ == "__main__":
    main()
