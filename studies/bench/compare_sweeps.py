"""Compare a pruned sweep with its unpruned twin (same sweep file, `run` and `run --no-prune`).

Prints, for each: wall time of the driver (run + resumes, from the study), trial states, the best trial (its
draw, params and final loss) and the compute in tokens against the unpruned total; then whether both sweeps
picked the same draw and the fraction of compute the pruned sweep used.

    .venv/bin/python studies/bench/compare_sweeps.py studies/quickstart.yaml
"""

from __future__ import annotations

import argparse
import sys

from collapse_hpo.hpo.outputs.report import best_row, compute, trial_rows
from collapse_hpo.hpo.sweep.config import load_sweep
from collapse_hpo.hpo.sweep.runner import WALL_ATTR, locate, open_study, unpruned_tokens


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table; exit 1 when the two sweeps picked different draws."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep")
    args = parser.parse_args(argv)
    sweep = load_sweep(args.sweep)
    picks = {}
    print("| sweep | wall time (s) | complete | pruned | failed | best trial (draw) | lr | final loss "
          "| tokens | fraction of unpruned |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fractions = {}
    for no_prune in (False, True):
        loc = locate(sweep, no_prune=no_prune)
        study = open_study(sweep, loc)
        rows = trial_rows(study)
        comp = compute(study, unpruned_tokens(sweep, study))
        best = best_row(rows)
        wall = sum(float(s["wall_s"]) for s in study.user_attrs.get(WALL_ATTR, []))
        n = {s: sum(1 for r in rows if r["state"] == s) for s in ("COMPLETE", "PRUNED", "FAIL")}
        picks[no_prune] = None if best is None else best["draw"]
        fractions[no_prune] = comp.fraction
        print(f"| {loc.study_name} | {wall:.0f} | {n['COMPLETE']} | {n['PRUNED']} | {n['FAIL']} | "
              f"{best['number']} ({best['draw']}) | {best['lr']:.4g} | {best['final_loss']:.4f} | "
              f"{comp.spent:.3g} | {comp.fraction:.3f} |" if best else f"| {loc.study_name} | no best |")
    same = picks[False] is not None and picks[False] == picks[True]
    print(f"\nsame best draw: {same} (pruned: {picks[False]}, unpruned: {picks[True]}); pruned sweep used "
          f"{100 * fractions[False]:.1f}% of the unpruned compute")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
