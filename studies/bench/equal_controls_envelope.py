"""How far a trial that ends better trails one that ends worse at equal fractions, their controls equal.

The rule compares trials with equal controls (τ, TPP, schedule) by their loss ratio at a common fraction t̂,
from the collapse onset t̂ = τ on, with the whole ``margin`` (4%) at every t̂ (hpo/rule/decision.py). A margin
that shrank as training goes on would prune the near-best trials earlier, which is where the τ-held sweeps and
the quickstart spend most (BENCHMARKS §19, §20). It is safe only if curves of equal controls stop crossing:
this script measures, per sweep and fraction, the largest log loss ratio by which a trial that ends *better*
trails one that ends *worse* (over every such pair: "all pairs"), and the same for the sweep's best trial only
("the best"), each with the rule's own window (``decision.loss_log_ratio`` over [max(t̂/2, τ), t̂]).

Sweeps: the development τ-held LR and batch sweeps (25K, studies/bench/artifacts/dev25k), the 99K τ-held
sweeps of §5, the quickstart's 12 trials and the tiny two-worker sweep (all in studies/bench/artifacts).

``--by-lr`` splits each envelope by the direction of the peak LRs (BENCHMARKS §43): the trial that ends better
trails with the higher peak LR, or with the lower one. A margin for one direction only would need the pruner
to know each trial's peak LR; the split says whether such a margin could be safe. The peak LR is the largest
value of a curve's ``lr`` column; a file whose curves all peak at the same value holds the schedule's shape
only (the quickstart's and the tiny sweep's: peak 1) and is left out of that table.

``--kth`` reads the envelope over the sweep's best by rank (BENCHMARKS §44): the largest, second and third
largest lead of a trial that ends worse over the best. A rule that cut a trial only when *k* competitors led
it by more than a margin of its own could take a smaller margin if the best's k-th leader led it by much
less than its first; the table says by how much.

Usage::

    .venv/bin/python studies/bench/equal_controls_envelope.py [--out FILE] [--by-lr | --kth]     # ≈ 5 s
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from collapse_hpo.hpo.rule.decision import collapse_onset, loss_log_ratio
from collapse_hpo.predictors.curves import Curve, read_curves_csv

ART = Path(__file__).resolve().parent / "artifacts"
SWEEPS = {
    "25K LR (dev)": "dev25k/curves_lr_tau.csv",
    "25K batch (dev)": "dev25k/curves_bs_tau.csv",
    "99K LR": "curves_lr_tau_full.csv",
    "99K batch": "curves_bs_tau_full.csv",
    "quickstart": "curves_quickstart.csv",
    "tiny two-worker": "curves_tiny_two_workers.csv",
}
FRACTIONS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def by_seed(curves: list[Curve]) -> dict[str, list[Curve]]:
    """One sweep per seed where run names end in _s<seed>_<k> (the §5 and development files), else one."""
    out: dict[str, list[Curve]] = {}
    for c in curves:
        parts = c.run.rsplit("_", 1)
        key = parts[0] if len(parts) == 2 and parts[1].isdigit() and "_s" in parts[0] else ""
        out.setdefault(key, []).append(c)
    return out


def sweeps() -> Iterator[tuple[str, list[Curve]]]:
    """(label, curves) of every sweep of ``SWEEPS`` with at least two trials, one per seed."""
    for name, rel in SWEEPS.items():
        for seed, curves in by_seed(read_curves_csv(ART / rel)).items():
            if len(curves) >= 2:
                yield (f"{name} {seed.rsplit('_', 1)[-1]}" if seed else name), curves


def crossings(curves: list[Curve], f: float) -> Iterator[tuple[Curve, Curve, float, bool]]:
    """Every pair (better, worse, lead, better is the sweep's best) where ``better`` ends below ``worse`` and
    ``lead`` is how far ``worse`` leads it at ``f`` (the rule's log loss ratio); none before the collapse
    onset."""
    final = {c.run: c.final_loss for c in curves}
    best = min(final, key=final.get)
    onset = collapse_onset(curves[0].tau)
    if f < onset:
        return
    for a in curves:  # a ends better than b
        for b in curves:
            if final[a.run] >= final[b.run]:
                continue
            r = loss_log_ratio(a.t_hat, a.loss, b.t_hat, b.loss, f, 0.5, onset=onset)
            if r is not None:
                yield a, b, r, a.run == best


def _largest(values: list[float]) -> float:
    return max(values) if values else np.nan


def envelope(curves: list[Curve], f: float) -> tuple[float, float]:
    """(all pairs, the best): the largest lead, as a log loss ratio at ``f``, of a trial that ends worse over
    one that ends better; NaN before the collapse onset or without a pair."""
    pairs = list(crossings(curves, f))
    return _largest([r for *_, r, _ in pairs]), _largest([r for *_, r, is_best in pairs if is_best])


def best_leads(curves: list[Curve], f: float, ranks: int = 3) -> tuple[float, ...]:
    """The ``ranks`` largest leads at ``f`` of a trial that ends worse over the sweep's best (the rule's log
    loss ratio, largest first; negative where the best leads it); NaN before the collapse onset or where
    fewer trials reach ``f``."""
    leads = sorted((r for _, _, r, is_best in crossings(curves, f) if is_best), reverse=True)
    return tuple(leads[k] if k < len(leads) else np.nan for k in range(ranks))


def peak_lrs(curves: list[Curve]) -> dict[str, float] | None:
    """Each curve's peak LR (its ``lr`` column's largest value); None when a curve has no LR or every curve
    peaks at the same value (the file holds the schedule's shape, not the LR)."""
    peaks: dict[str, float] = {}
    for c in curves:
        if c.lr is None or not np.isfinite(c.lr).any():
            return None
        peaks[c.run] = float(np.nanmax(c.lr))
    values = list(peaks.values())
    return None if np.allclose(values, values[0], rtol=1e-9, atol=0.0) else peaks


def envelope_by_lr(curves: list[Curve], peaks: dict[str, float], f: float) -> tuple[float, ...]:
    """``envelope`` split by the peak LRs: (all pairs, the best) where the trial that ends better has the
    higher peak LR, then (all pairs, the best) where it has the lower one; NaN where no such pair."""
    out: list[float] = []
    for higher in (True, False):
        side = [(r, is_best) for a, b, r, is_best in crossings(curves, f)
                if peaks[a.run] != peaks[b.run] and (peaks[a.run] > peaks[b.run]) == higher]
        out += [_largest([r for r, _ in side]), _largest([r for r, is_best in side if is_best])]
    return tuple(out)


BY_LR_ROWS = ("higher LR, all", "higher LR, best", "lower LR, all", "lower LR, best")


def _cells(rows: list[tuple[float, ...]], k: int) -> str:
    return " | ".join("–" if np.isnan(r[k]) else f"{100 * r[k]:.1f}" for r in rows)


def _head(caption: str, columns: tuple[str, ...]) -> list[str]:
    """A table's caption, a blank line, its header (``columns``, then one per fraction) and the rule."""
    names = [*columns, *(f"t̂ {f:g}" for f in FRACTIONS)]
    return [caption, "", "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]


def envelope_table() -> list[str]:
    """The default table's lines: per sweep, ``envelope`` over all pairs and over the best."""
    lines = _head("Largest lead (%) of a trial that ends worse over one that ends better, equal controls; "
                  "\"all\": every such pair, \"best\": over the sweep's best trial.",
                  ("sweep", "trials", "τ", "pairs"))
    for label, curves in sweeps():
        rows = [envelope(curves, f) for f in FRACTIONS]
        for k, what in enumerate(("all", "best")):
            lines.append(f"| {label} | {len(curves)} | {curves[0].tau:.3g} | {what} | {_cells(rows, k)} |")
    return lines


def by_lr_table() -> list[str]:
    """The ``--by-lr`` table's lines: per sweep with peak LRs, the four envelopes of ``envelope_by_lr``."""
    lines = _head("Largest lead (%) of a trial that ends worse over one that ends better, equal controls, by "
                  "whether the trial that ends better has the higher or the lower peak LR (\"best\": the "
                  "sweep's best as that trial).", ("sweep", "trailing trial"))
    for label, curves in sweeps():
        peaks = peak_lrs(curves)
        if peaks is None:
            continue
        rows = [envelope_by_lr(curves, peaks, f) for f in FRACTIONS]
        for k, what in enumerate(BY_LR_ROWS):
            lines.append(f"| {label} | {what} | {_cells(rows, k)} |")
    return lines


KTH_ROWS = ("1st", "2nd", "3rd")


def kth_table() -> list[str]:
    """The ``--kth`` table's lines: per sweep, the best's 1st, 2nd and 3rd largest lead (``best_leads``)."""
    lines = _head("Lead (%) over the sweep's best of the trials that end worse, by rank: the largest, the "
                  "second and the third largest, equal controls (negative: the best leads them all from that "
                  "rank on).", ("sweep", "leader"))
    for label, curves in sweeps():
        rows = [best_leads(curves, f, len(KTH_ROWS)) for f in FRACTIONS]
        for k, what in enumerate(KTH_ROWS):
            lines.append(f"| {label} | {what} | {_cells(rows, k)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    ap.add_argument("--by-lr", action="store_true",
                    help="the envelopes split by the direction of the peak LRs (sweeps whose files hold LRs)")
    ap.add_argument("--kth", action="store_true",
                    help="the best's 1st, 2nd and 3rd largest lead by a trial that ends worse")
    args = ap.parse_args(argv)
    if args.by_lr and args.kth:
        ap.error("--by-lr and --kth are two tables: ask for one")
    text = "\n".join(by_lr_table() if args.by_lr else kth_table() if args.kth else envelope_table())
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
