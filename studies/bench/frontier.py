"""Frontiers of every sweep family: each pruner family's own knobs swept (issue 20, "Frontier" target).

For every sweep family, every setting of ``peers.FRONTIER_KNOBS`` (hpo/replays/frontier.py, the engine of
``collapse-hpo replay --frontier``) is replayed over the same ``--orders`` random trial orders with 4
concurrent workers; a family with several sweeps (one per seed) gets each setting's compute, mean regret and
best-cut rate averaged over its sweeps. Then, per sweep family:

- the table: for each pruner family, the least compute of a setting at a mean regret of 0, ≤ 0.1%, ≤ 0.3% and
  ≤ 1% (with that setting's best-cut rate), from the family's frontier;
- the target: for every point of every peer's compute-regret frontier, is there a setting of ours (collapse,
  collapse-online, counted separately) at no more compute and no more mean regret? Hits and misses listed.

Sweep families and the references of ``collapse`` (never the sweep itself):

- τ-held: artifacts/curves_lr_tau_full.csv, curves_bs_tau_full.csv (two seeds each), and
- λ-fixed: curves_lr_lambda_full.csv, curves_bs_lambda_full.csv: the surrogate calibrated on the collapse
  family of the same runs (curves_collapse_tau_full.csv + curves_collapse_lambda_full.csv), as in §6;
- random configs: curves_random_s0.csv judged with a surrogate calibrated on curves_random_s1.csv and the
  reverse (§11);
- surestop_lora: ../shared/extdata/surestop_lora, the later nights' 107 runs replayed, the surrogate
  calibrated on the earlier nights' 90 (studies/bench/surestop_lora.py);
- the quickstart: artifacts/curves_quickstart.csv, the 12 trials of ``collapse-hpo run studies/quickstart.yaml
  --no-prune`` (artifacts/curves_quickstart.COMMAND.txt), judged with the builtin prior (predictors/prior.py,
  calibrated on another model family: out of sample), the reference the live quickstart starts from;
  ``--quickstart CSV`` replays another run (its collapse reference: ``--quickstart-reference``).

Writes artifacts/frontier.{md,csv} and artifacts/frontier_<family>.png (compute against mean regret and
against best-cut rate, one marker set per pruner family). Progress on stderr.

Usage::

    nice -n 10 .venv/bin/python studies/bench/frontier.py --orders 10 [--family lora] [--skip-online]
    # after a change of the collapse rule: replay collapse only, the peers' points from the last run
    nice -n 10 .venv/bin/python studies/bench/frontier.py --orders 10 --skip-online --only collapse \
        --reuse studies/bench/artifacts/frontier.csv
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts"
sys.path.insert(0, str(HERE))

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.frontier import (  # noqa: E402
    FrontierPoint,
    coverage,
    frontier,
    mark_frontiers,
    plot_frontier,
    write_frontier_csv,
)
from collapse_hpo.hpo.replays.replay import LATE_FRACTION, Sweep, make_sweep  # noqa: E402
from collapse_hpo.predictors.calibrate import calibrate  # noqa: E402
from collapse_hpo.predictors.curves import Curve, read_curves_csv  # noqa: E402

REPORTS = 50  # report points per trial where a sweep's grids differ (as §6 and §11)
#: The regret levels of the table (share of the best final loss).
LEVELS = (0.0, 0.001, 0.003, 0.01)


@dataclass
class SweepFamily:
    """A family of sweeps (one per seed) and the surrogate ``collapse`` judges each sweep with."""

    name: str
    sweeps: list[Sweep]
    surrogates: list[Any]  # one per sweep (None: collapse is skipped for it)
    note: str


def log(msg: str) -> None:
    """Progress on stderr."""
    print(msg, file=sys.stderr, flush=True)


def _quiet_calibrate(curves: list[Curve]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibrate(curves).surrogate


def _by_seed(path: Path, family: str) -> list[Sweep]:
    """One sweep per seed of a §5 curve file (run names ``<family>_s<seed>_<i>``)."""
    curves = read_curves_csv(path)
    out = []
    for seed in sorted({c.run.split("_")[2] for c in curves}):
        sel = [c for c in curves if c.run.split("_")[2] == seed]
        out.append(make_sweep(sel, n_reports=REPORTS, name=f"{family}_{seed}", source=str(path)))
    return out


#: The sweep families ``load_families`` knows, by their ``--family`` name.
SWEEP_FAMILIES = ("tau", "lambda", "random", "lora", "quickstart")


def add_family_arguments(
    ap: argparse.ArgumentParser, families: tuple[str, ...] = SWEEP_FAMILIES, extra: tuple[str, ...] = ()
) -> None:
    """The arguments ``load_families`` reads: ``--family`` (repeatable; ``families``, plus ``extra`` choices
    a script handles itself), ``--quickstart`` and ``--quickstart-reference``. One definition for every
    script that replays the frontier's sweeps."""
    ap.add_argument("--family", action="append", choices=(*families, *extra),
                    help="sweep family (repeatable; default: all)")
    ap.add_argument("--quickstart", default=str(ART / "curves_quickstart.csv"),
                    help="curve CSV of an unpruned quickstart run (default: the committed one)")
    ap.add_argument("--quickstart-reference", default=None,
                    help="reference curves for its collapse surrogate (default: the builtin prior)")


def load_families(args: argparse.Namespace) -> list[SweepFamily]:
    """The sweep families asked for, with their collapse references (``add_family_arguments``)."""
    from surestop_lora import read_surestop_lora, split_nights

    want = set(args.family or SWEEP_FAMILIES)
    out: list[SweepFamily] = []
    if want & {"tau", "lambda"}:
        log("calibrating the §5 collapse family (reference of the τ-held and λ-fixed sweeps)")
        ref = _quiet_calibrate(read_curves_csv(ART / "curves_collapse_tau_full.csv")
                               + read_curves_csv(ART / "curves_collapse_lambda_full.csv"))
        for key, kind in (("tau", "τ-held"), ("lambda", "λ-fixed")):
            if key in want:
                sweeps = [s for f in ("lr", "bs") for s in
                          _by_seed(ART / f"curves_{f}_{key}_full.csv", f"{f}_{key}")]
                out.append(SweepFamily(kind, sweeps, [ref] * len(sweeps),
                                       f"curves_{{lr,bs}}_{key}_full.csv, one sweep per seed; collapse's "
                                       "reference: the collapse family of the same set"))
    if "random" in want:
        log("calibrating the random-config sweeps (each is the other's reference)")
        curves = [read_curves_csv(ART / f"curves_random_s{k}.csv") for k in (0, 1)]
        sweeps = [make_sweep(c, n_reports=REPORTS, name=f"random_s{k}") for k, c in enumerate(curves)]
        refs = [_quiet_calibrate(curves[1]), _quiet_calibrate(curves[0])]
        out.append(SweepFamily("random configs", sweeps, refs,
                               "curves_random_s0/s1.csv; each judged with a surrogate calibrated on the "
                               "other"))
    if "lora" in want:
        earlier, later = split_nights(read_surestop_lora())
        log(f"surestop_lora: calibrating on the {len(earlier)} runs of the earlier nights")
        sweep = make_sweep(later, name="surestop_lora_later")
        out.append(SweepFamily("surestop_lora", [sweep], [_quiet_calibrate(earlier)],
                               f"the later nights' {len(later)} runs; collapse's reference calibrated on the "
                               f"earlier nights' {len(earlier)}"))
    if "quickstart" in want:
        from collapse_hpo.predictors.prior import load_prior

        sweep = make_sweep(read_curves_csv(args.quickstart), n_reports=REPORTS, name="quickstart_noprune")
        if args.quickstart_reference:
            ref = _quiet_calibrate(read_curves_csv(args.quickstart_reference))
            what = args.quickstart_reference
        else:
            ref, what = load_prior("builtin")[0], "the builtin prior"
        out.append(SweepFamily("quickstart", [sweep], [ref], f"{Path(args.quickstart).name}; collapse's "
                               f"reference: {what}"))
    return out


def families_for(args: argparse.Namespace, surrogate: Any) -> list[str]:
    """The pruner families to sweep on one sweep."""
    names = [f for f in peers.FRONTIER_KNOBS if f not in args.skip]
    if surrogate is None and "collapse" in names:
        names.remove("collapse")
    for family, module in peers.FRONTIER_OPTIONAL.items():
        if family in names and peers.unavailable_module(module):
            log(f"{family} skipped: the {module!r} package is not installed")
            names.remove(family)
    return names


def averaged(family: str, per_sweep: list[list[FrontierPoint]]) -> list[FrontierPoint]:
    """Each setting's compute, mean regret and best-cut rate averaged over the family's sweeps (settings
    present in every sweep), frontiers marked anew."""
    labels = [p.setting for p in per_sweep[0]]
    common = [lab for lab in labels if all(any(p.setting == lab for p in pts) for pts in per_sweep)]
    out = []
    for lab in common:
        rows = [next(p for p in pts if p.setting == lab) for pts in per_sweep]
        out.append(FrontierPoint(
            sweep=family, family=rows[0].family, setting=lab,
            compute=sum(r.compute for r in rows) / len(rows), regret=sum(r.regret for r in rows) / len(rows),
            best_cut=sum(r.best_cut for r in rows) / len(rows), orders=sum(r.orders for r in rows),
            late=sum(r.late for r in rows) / len(rows),
        ))
    mark_frontiers(out)
    return out


def cheapest(points: list[FrontierPoint], family: str, level: float) -> FrontierPoint | None:
    """The least-compute setting of ``family`` at a mean regret of at most ``level`` (None if none)."""
    ok = [p for p in points if p.family == family and p.regret <= level + 1e-12]
    return min(ok, key=lambda p: (p.compute, p.regret)) if ok else None


def markdown(results: list[tuple[SweepFamily, list[FrontierPoint]]], orders: int) -> str:
    """The BENCHMARKS table and the target lines."""
    head = ("| sweep family | pruner family | regret 0 | ≤ 0.1% | ≤ 0.3% | ≤ 1% |\n"
            "|---|---|---:|---:|---:|---:|")
    lines = [f"Least compute (share of the unpruned sweep's tokens) of a setting at each mean regret, with "
             f"its best-cut rate and its late compute (the share spent on trials pruned after t̂ "
             f"{LATE_FRACTION:g}; '-' where an older run did not record it) in brackets; {orders} orders per "
             f"sweep, averaged over a family's sweeps.",
             "", head]
    verdicts = []
    for fam, points in results:
        families = list(dict.fromkeys(p.family for p in points))
        for family in families:
            cells = []
            for level in LEVELS:
                p = cheapest(points, family, level)
                late = "-" if p is None or p.late != p.late else f"{p.late:.3f}"  # NaN: not recorded
                cells.append("-" if p is None else f"{p.compute:.3f} ({p.best_cut:.2f}; {late})")
            lines.append(f"| {fam.name} | {family} | " + " | ".join(cells) + " |")
        for ours in (f for f in families if f in peers.FRONTIER_OURS):
            covs = [coverage(points, ours, peer) for peer in families if peer not in peers.FRONTIER_OURS]
            hit = all(c.hit for c in covs)
            detail = "; ".join(f"{c.peer} {c.covered}/{c.total}" for c in covs)
            missed = [m for c in covs for m in c.missed]
            verdicts.append(f"- {fam.name}, {ours}: {'HIT' if hit else 'MISS'} ({detail})"
                            + (f"; not covered: {', '.join(missed)}" if missed else ""))
    lines += ["", "Frontier target (every point of every peer's compute-regret frontier matched by a setting "
              "of ours at no more compute and no more mean regret), frontier points covered per peer:", "",
              *verdicts]
    return "\n".join(lines)


def read_points(path: Path, orders: int) -> list[FrontierPoint]:
    """The per-sweep points of an earlier run's frontier.csv (each sweep's own rows, not the family
    averages); refused when they were replayed over another number of orders."""
    import csv

    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = [FrontierPoint(sweep=r["sweep"], family=r["family"], setting=r["setting"],
                         compute=float(r["compute"]), regret=float(r["regret"]),
                         best_cut=float(r["best_cut"]), orders=int(r["orders"]),
                         late=float(r.get("late") or "nan"))
           for r in rows]
    per_sweep = [p for p in out if p.orders == orders]
    if not per_sweep:
        raise SystemExit(f"frontier: {path} has no points replayed over {orders} orders")
    return per_sweep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=1)
    add_family_arguments(ap)
    ap.add_argument("--skip", action="append", default=[], help="a pruner family to leave out (repeatable)")
    ap.add_argument("--skip-online", action="store_true", help="leave collapse-online out (the slowest)")
    ap.add_argument("--only", action="append", default=None,
                    help="replay only this pruner family (repeatable); the others come from --reuse")
    ap.add_argument("--reuse", default=None,
                    help="frontier.csv of an earlier run (same --orders): the per-sweep points of the "
                         "families not replayed now")
    ap.add_argument("--out", default=str(ART))
    args = ap.parse_args(argv)
    if args.skip_online:
        args.skip.append("collapse-online")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reused = read_points(Path(args.reuse), args.orders) if args.reuse else []
    if args.only and not reused:
        ap.error("--only needs --reuse (the points of the other families)")
    t0 = time.perf_counter()
    results: list[tuple[SweepFamily, list[FrontierPoint]]] = []
    every: list[FrontierPoint] = []
    for fam in load_families(args):
        per_sweep = []
        for sweep, sur in zip(fam.sweeps, fam.surrogates):
            names = families_for(args, sur)
            log(f"[{time.perf_counter() - t0:6.0f} s] {fam.name}: {sweep.name} ({sweep.n_trials} trials, "
                f"{sweep.grid.size} reports), {', '.join(names)}")
            only = args.only or ()
            kept = [p for p in reused if p.sweep == sweep.name and p.family not in only]
            if args.only:
                names = [n for n in names if n in args.only]
            pts = frontier(sweep, names, surrogate=sur, orders=args.orders, workers=args.workers,
                           jobs=args.jobs, progress=lambda line, s=sweep.name: log(f"  {s} {line}"))
            pts = kept + pts
            mark_frontiers(pts)
            per_sweep.append(pts)
            every += pts
        points = averaged(fam.name, per_sweep)
        results.append((fam, points))
        every += points
        slug = fam.name.split()[0].replace("τ", "tau").replace("λ", "lambda").replace("-", "_")
        plot_frontier(out / f"frontier_{slug}.png", points,
                      title=f"{fam.name}: {fam.note} ({args.orders} orders per sweep)")
    text = markdown(results, args.orders)
    print(text)
    from collapse_hpo.predictors.atomic import atomic_write

    with atomic_write(out / "frontier.md", "w") as fh:
        fh.write(text + "\n")
    write_frontier_csv(out / "frontier.csv", every)
    log(f"done in {time.perf_counter() - t0:.0f} s; wrote {out}/frontier.md, frontier.csv, frontier_*.png")
    return 0 if all(math.isfinite(p.compute) for p in every) else 1


if __name__ == "__main__":
    raise SystemExit(main())
