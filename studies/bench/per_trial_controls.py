"""Per-trial controls: the collapse rule against every peer on sweeps whose τ, warm-up and schedule differ per
trial (issue 15, second bullet).

Sweeps (50 report points per trial, ``--orders`` random trial orders, ``--workers`` concurrent trials):

- ``random_s0``, ``random_s1``: the random-configuration CPU sweeps of studies/bench/random_configs.py (48
  trials each: LR, λ, batch, warm-up fraction, schedule shape and seed drawn at random per trial; τ = B/(ηλD)
  differs in every trial). Sweep seed 0 is reserved for development (a setting may be chosen on it and on
  the 25K λ-fixed sweeps of artifacts/dev25k; none was in this change); sweep seed 1 is out of sample.
- ``lr_lambda_s0/s1``, ``bs_lambda_s0/s1``: the 99K λ-fixed sweeps of BENCHMARKS.md §5/§6 (λ fixed, so τ
  moves with the LR or batch; warm-up and schedule shared).

Ours, with two kinds of reference:

- ``collapse`` (defaults) and ``collapse-tuned`` (confidence 0.7, chosen in an earlier stop on the 25K
  τ-held sweeps: out of sample for every sweep here), with a fixed reference calibrated once. For a random
  sweep it is the *other* random sweep (a previous sweep of the same kind, the issue's "surrogate calibrated
  on half of the runs"): random_s0 is judged with a surrogate calibrated on random_s1 and the reverse. For a
  λ-fixed sweep it is the collapse family of its set (as in studies/bench/pruning_rule.py).
- ``collapse-online``: calibrated on the sweep's own completed trials (no reference). It refits whenever the
  set of completed trials changes, which today takes most of the replay time (the replay-speed bullet of
  issue 15 is another change): ``--online-orders`` replays it on fewer orders than the rest (stated in the
  table).

Target (issue 15): at zero regret (the best trial never cut in any order), less compute than every peer that
also keeps the best in every order. The table says met or MISSED per sweep; the decision-time distribution
(t̂ at which each prune happened) of ours is given as median and quartiles and drawn as a histogram.

Usage::

    .venv/bin/python studies/bench/per_trial_controls.py                   # 20 orders (online: 5)
    .venv/bin/python studies/bench/per_trial_controls.py --orders 5 --sweeps random_s0

Writes ``per_trial_controls[_<tag>].{md,csv,png}`` and ``per_trial_controls[_<tag>]_decisions.png`` to
``--out`` and prints the markdown. Every figure is measured in the run.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pruning_rule  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import (  # noqa: E402
    STEP_SCALE,
    ReplayResult,
    Summary,
    Sweep,
    make_sweep,
    plot_compute_regret,
    replay,
    write_summary_csv,
)
from collapse_hpo.hpo.rule.decision import PruneSettings  # noqa: E402
from collapse_hpo.hpo.rule.judge import Judge, TrialView  # noqa: E402
from collapse_hpo.hpo.rule.record import DecisionEntry, TrialControls  # noqa: E402
from collapse_hpo.predictors.calibrate import calibrate  # noqa: E402
from collapse_hpo.predictors.curves import Curve, read_curves_csv  # noqa: E402

ART = HERE / "artifacts"
REPORTS = 50
RANDOM_SWEEPS = ("random_s0", "random_s1")
LAMBDA_SWEEPS = ("lr_lambda_s0", "lr_lambda_s1", "bs_lambda_s0", "bs_lambda_s1")
ALL_SWEEPS = (*RANDOM_SWEEPS, *LAMBDA_SWEEPS)
OURS = ("collapse", "collapse-tuned", "collapse-online")
#: Sweeps on which the rule's changes were chosen (in sample); the others are out of sample.
DEVELOPMENT = ("random_s0",)


class DirectCollapse:
    """Our CollapsePruner's judgements in a replay, without the Optuna study around them.

    The same ``Judge`` (hpo/rule/judge.py) and rule (hpo/rule/decision.py) as ``peers.collapse_factory``, fed
    the same trial views: trials numbered in start order, steps in thousandths of training (t̂ = step / 1000),
    controls as ``set_trial_controls`` stores them (the schedule through its dict), decision entries through
    their stored form, competitors in trial-number order. What it skips is the in-memory Optuna storage, which
    rebuilds every trial's record at every judgement and takes most of the replay time on 48-trial sweeps.
    ``tests/test_bench_per_trial_controls.py`` checks that it stops every trial at the same report as the real
    pruner. A fixed surrogate only (``collapse-online`` needs the study: use the peers' factory).
    """

    def __init__(self, name: str, surrogate: Any, **settings: Any) -> None:
        self.name, self.surrogate = name, surrogate
        judge_every = settings.pop("judge_every", 0.02)
        self.judge = Judge(PruneSettings(**settings), judge_every=judge_every)

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        """Forget every trial."""
        self.sweep = sweep
        self.steps = sweep.steps.astype(float)
        self.number: dict[int, int] = {}  # sweep index -> trial number (start order)
        self.state: dict[int, str] = {}
        self.upto: dict[int, int] = {}  # grid points reported so far
        self.logs: dict[int, list[DecisionEntry]] = {}
        self.controls: dict[int, TrialControls] = {}

    def start(self, trial: int) -> None:
        """The trial is numbered and its controls recorded as the pruner reads them back."""
        c = self.sweep.curves[trial]
        self.number[trial] = len(self.number)
        self.state[trial], self.upto[trial], self.logs[trial] = "running", 0, []
        sched = None if c.schedule is None else c.schedule.to_dict()
        self.controls[trial] = TrialControls.check(
            total_tokens=STEP_SCALE, schedule=sched, tau=c.tau, tpp=c.tpp, where=f"trial {trial}"
        )

    def _view(self, trial: int) -> TrialView:
        n = self.upto[trial]
        steps = self.steps[:n]
        final = float(self.sweep.finals[trial]) if self.state[trial] == "complete" else None
        return TrialView(self.number[trial], self.state[trial], steps, steps / STEP_SCALE,
                         self.sweep.losses[trial, :n], self.controls[trial], final, tuple(self.logs[trial]))

    def report(self, trial: int, index: int) -> bool:
        """Judge the trial at its new report, as ``CollapsePruner.prune`` does."""
        self.upto[trial] = index + 1

        def others() -> list[TrialView]:
            return [self._view(t) for t in sorted(self.number, key=self.number.__getitem__)]

        verdict = self.judge.judge(self._view(trial), others, lambda: (self.surrogate, "surrogate"))
        if verdict.entry is not None:
            self.logs[trial].append(DecisionEntry.from_dict(verdict.entry.to_dict()))
        return verdict.prune

    def finish(self, trial: int, pruned: bool) -> None:
        """The trial ends pruned, or complete with its final loss."""
        self.state[trial] = "pruned" if pruned else "complete"


def direct_factory(name: str, surrogate: Any, **settings: Any):
    """A factory of ``DirectCollapse`` (one fresh object per replayed order)."""
    return lambda: DirectCollapse(name, surrogate, **dict(settings))


def log(msg: str) -> None:
    """Progress on stderr."""
    print(msg, file=sys.stderr, flush=True)


def random_curves(name: str, art: Path = ART) -> list[Curve]:
    """The curves of a random-configuration sweep (``random_s<seed>``)."""
    seed = name.split("_s")[1]
    return read_curves_csv(art / f"curves_random_s{seed}.csv")


def load_sweep(name: str, art: Path = ART) -> Sweep:
    """One sweep by name, on the common 50-point report grid."""
    if name in RANDOM_SWEEPS:
        return make_sweep(random_curves(name, art), n_reports=REPORTS, name=name, source=name)
    family = name.rsplit("_", 1)[0]
    return next(s for s in pruning_rule.sweeps(pruning_rule.EVAL, family) if s.name == name)


def fit(curves: list[Curve]) -> Any:
    """A surrogate calibrated on reference curves (calibrate's defaults: groups by controls, 5 folds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibrate(curves, folds=5).surrogate


def reference_for(name: str, cache: dict[str, Any], art: Path = ART) -> tuple[Any, str]:
    """The fixed reference surrogate for a sweep and what it was calibrated on (cached per source)."""
    if name in RANDOM_SWEEPS:
        other = RANDOM_SWEEPS[1 - RANDOM_SWEEPS.index(name)]
        if other not in cache:
            cache[other] = fit(random_curves(other, art))
        return cache[other], f"the other random sweep ({other})"
    if "family" not in cache:
        cache["family"] = pruning_rule.reference(pruning_rule.EVAL)[0]
    return cache["family"], "the 99K collapse family (4 sizes, 2 seeds)"


def run(sweep: Sweep, factories: list, orders: int, workers: int) -> tuple[list[Summary], dict]:
    """Replay a sweep through pruners (the peers' library warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return replay(sweep, factories, orders=orders, workers=workers, seed=0)


def quartiles(details: list[ReplayResult]) -> tuple[float, float, float, int]:
    """(25th, 50th, 75th percentile of the prune decisions' t̂, number of prunes) over the replays."""
    dec = [f for r in details for f in r.decision_fractions]
    if not dec:
        return float("nan"), float("nan"), float("nan"), 0
    q = np.percentile(dec, [25, 50, 75])
    return float(q[0]), float(q[1]), float(q[2]), len(dec)


def pair_errors(sweep: Sweep, surrogate: Any, fractions=(0.1, 0.2, 0.3, 0.5)) -> list[str]:
    """How much the curves of a sweep cross: per fraction f of the report grid, over all pairs of trials, the
    RMS error (log units) of the ratio of final losses estimated by the ratio of current losses (mean log over
    [f/2, f]) and by the ratio of the surrogate's predictions from the points up to f (each trial with its own
    controls); and the largest lead any trial had over the eventual best by each estimate (what a margin
    must cover to keep the best). Markdown rows."""
    from collapse_hpo.predictors.predict import predict_final_loss

    fin = np.log(sweep.finals)
    best = sweep.best
    i, j = np.triu_indices(sweep.n_trials, 1)
    rows = []
    for f in fractions:
        k = int(np.flatnonzero(sweep.grid >= f - 1e-9)[0])
        ff = float(sweep.grid[k])
        win = (sweep.grid >= 0.5 * ff - 1e-9) & (sweep.grid <= ff + 1e-9)
        raw = np.log(sweep.losses[:, win]).mean(axis=1)
        pred = np.full(sweep.n_trials, np.nan)
        for n, c in enumerate(sweep.curves):
            p = predict_final_loss(sweep.grid[: k + 1], sweep.losses[n, : k + 1], surrogate=surrogate,
                                   schedule=c.schedule, tau=c.tau, tpp=c.tpp)
            pred[n] = np.log(p.final_loss) if p.ok else np.nan
        er = (raw[i] - raw[j]) - (fin[i] - fin[j])
        es = (pred[i] - pred[j]) - (fin[i] - fin[j])
        rows.append(
            f"| {sweep.name} | {ff:.2f} | {np.sqrt(np.nanmean(er**2)):.3f} "
            f"| {np.sqrt(np.nanmean(es**2)):.3f} "
            f"| {np.nanmax(raw[best] - raw):.3f} | {np.nanmax(pred[best] - pred):.3f} |"
        )
    return rows


def verdict(me: Summary, peers_: list[Summary]) -> tuple[str, str]:
    """(the cheapest peer that keeps the best in every order, met/MISSED of the target for ``me``)."""
    keepers = [s for s in peers_ if s.best_pruned_rate == 0]
    cheapest = min(keepers, key=lambda s: s.compute) if keepers else None
    cheap = "none" if cheapest is None else f"{cheapest.pruner} {cheapest.compute:.3f}"
    if me.best_pruned_rate > 0:
        return cheap, f"MISSED (best cut in {me.best_pruned_rate:.0%} of orders)"
    if cheapest is not None and cheapest.compute <= me.compute:
        return cheap, f"MISSED ({cheapest.pruner} keeps the best for less)"
    return cheap, "met"


def plot_decisions(path: Path, fractions: dict[str, list[float]], title: str) -> None:
    """Histogram of the t̂ at which each prune happened, one line per pruner, written atomically as PNG."""
    from collapse_hpo.hpo.figures import pyplot, save_png

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    bins = np.linspace(0.0, 1.0, 21)
    for name, dec in fractions.items():
        if dec:
            med = float(np.median(dec))
            ax.hist(dec, bins=bins, histtype="step", lw=1.5, label=f"{name} (n={len(dec)}, median {med:.2f})")
    ax.set_xlabel("t̂ at which the trial was pruned")
    ax.set_ylabel("prunes (all sweeps and orders)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    """Replay the sweeps through ours and every peer; write and print the report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--orders", type=int, default=20, help="random trial orders per sweep (default 20)")
    ap.add_argument("--online-orders", type=int, default=5,
                    help="orders for collapse-online, whose refits are slow today (default 5; 0 = skip)")
    ap.add_argument("--workers", type=int, default=4, help="concurrent trials in the replays (default 4)")
    ap.add_argument("--sweeps", nargs="+", default=list(ALL_SWEEPS), choices=ALL_SWEEPS)
    ap.add_argument("--no-peers", action="store_true", help="replay ours only (development runs)")
    ap.add_argument("--out", default=str(ART), help="folder for per_trial_controls.{md,csv,png}")
    ap.add_argument("--tag", default="", help="suffix of the output names (per_trial_controls_<tag>.md, ...)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "per_trial_controls" + (f"_{args.tag}" if args.tag else "")
    given = " ".join(argv if argv is not None else sys.argv[1:])
    t_start = time.time()
    names = [n for n in peers.PEERS if n != "none"]
    refs: dict[str, Any] = {}
    rows: list[Summary] = []
    decisions: dict[str, list[float]] = {n: [] for n in OURS}
    crossing: list[str] = []
    lines = [
        "| sweep | trials | ours | orders | compute | best cut | mean regret "
        "| prune t̂ q25 / median / q75 (n) "
        "| cheapest peer keeping the best in every order | target |",
        "|---|---:|---|---:|---:|---:|---:|---|---|---|",
    ]
    for name in args.sweeps:
        sw = load_sweep(name)
        t0 = time.time()
        surrogate, ref_what = reference_for(name, refs)
        facs = [direct_factory(n, surrogate, **peers.COLLAPSE_SETTINGS[n]) for n in OURS[:2]]
        peer_sums: list[Summary] = []
        if not args.no_peers:
            peer_sums, _ = run(sw, [peers.factory(n) for n in names], args.orders, args.workers)
        mine, details = run(sw, facs, args.orders, args.workers)
        if args.online_orders > 0:
            on, on_details = run(sw, [peers.factory("collapse-online")], args.online_orders, args.workers)
            mine += on
            details.update(on_details)
        rows += mine + peer_sums
        sample = "in sample" if name in DEVELOPMENT else "out of sample"
        for me in mine:
            q25, q50, q75, n = quartiles(details[me.pruner])
            decisions[me.pruner] += [f for r in details[me.pruner] for f in r.decision_fractions]
            cheap, met = verdict(me, peer_sums) if peer_sums else ("-", "no peers replayed")
            dec = "-" if n == 0 else f"{q25:.2f} / {q50:.2f} / {q75:.2f} ({n})"
            what = me.pruner + ("" if me.pruner == "collapse-online" else f" (reference: {ref_what})")
            lines.append(
                f"| {name} ({sample}) | {sw.n_trials} | {what} | {me.orders} | {me.compute:.3f} "
                f"| {me.best_pruned_rate:.2f} | {me.relative_regret:.3%} | {dec} | {cheap} | {met} |"
            )
        if name in RANDOM_SWEEPS:
            crossing += pair_errors(sw, surrogate)
        log(f"{name}: {len(mine) + len(peer_sums)} pruners in {time.time() - t0:.0f} s")
    md = [
        "# Per-trial controls: ours against every peer (studies/bench/per_trial_controls.py)",
        "",
        f"Command: `python studies/bench/per_trial_controls.py {given}`".replace(" `", " `", 1).rstrip()
        + f"; {args.orders} orders ({args.online_orders} for collapse-online), {args.workers} workers, "
        f"{REPORTS} reports per trial.",
        "",
        *lines,
        "",
    ]
    all_dec = [f for d in decisions.values() for f in d]
    for pruner, dec in decisions.items():
        if dec:
            q = np.percentile(dec, [25, 50, 75])
            md.append(f"Decision times of {pruner}, all sweeps: {len(dec)} prunes, t̂ quartiles "
                      f"{q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f}.")
    if crossing:
        md += [
            "",
            "How much the curves cross (all pairs of trials; log units; surrogate = the fixed reference):",
            "",
            "| sweep | t̂ | pair error RMS, loss ratio | pair error RMS, surrogate "
            "| largest lead over the best, loss ratio | largest lead over the best, surrogate |",
            "|---|---:|---:|---:|---:|---:|",
            *crossing,
        ]
    md += ["", f"Time: {time.time() - t_start:.0f} s.", ""]
    write_summary_csv(out / f"{stem}.csv", rows)
    if not args.no_peers:
        plot_compute_regret(out / f"{stem}.png", rows,
                            title=f"{', '.join(args.sweeps)}: compute vs regret, {args.orders} orders")
    if all_dec:
        plot_decisions(out / f"{stem}_decisions.png", decisions,
                       title="when ours pruned (t̂ of each prune), all sweeps and orders")
    text = "\n".join(md)
    (out / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
