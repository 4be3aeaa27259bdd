"""The evidence benchmark: collapse at CPU scale, early stopping against every peer, and the bug alarm.

    .venv/bin/python studies/bench/evidence.py --size full    # trains ~160 small runs (see evidence_train.py)
    .venv/bin/python studies/bench/evidence.py --size small   # tiny models, a few minutes (the test suite's)

Parts (``--parts``, default all):

- ``train``: the runs of the size's plan (evidence_train.py), cached under ``--cache``; cached runs are
  reused.
- ``replay``: every sweep (each seed separately) replayed through every pruner (hpo/replays/peers.py) in
``--orders``
  random trial orders with ``--workers-replay`` concurrent trials; the collapse pruner's reference surrogate
  is calibrated on the collapse families (other seeds, other sizes: never on the sweep itself). Plus the
  ordering stability: Spearman ρ of predicted (and of current) loss at fraction p against the final loss.
- ``collapse``: Δ of the τ-optimal and of the λ-fixed family, Δ/σ with 2 seeds, the surrogate's MAE on a
  held-out size (calibrated on the other sizes), and a plot of both families' normalized curves.
- ``alarm``: the deviation alarm (predictors/residuals.py) and the raw-loss rule chosen on calibration runs
  (clean and faulty) and measured on test runs: false alarms on clean runs, alarm t̂ on faulty runs.
- ``external``: replays of real external curves (``--extdata``): mpl_luo2025 schedule sweeps at each size
  (reference: calibrated on the other sizes) and qiu_supercollapse chess widths; converted in memory.

Outputs in ``--out``: curve CSVs of every trained family (``curves_<family>_<size>.csv``), replay tables
(``replay_<size>.csv``), plots (PNG) and ``evidence_<size>.md`` / ``evidence_<size>.json`` with every number
and the command that made it. Every figure printed here is measured in this run; nothing is hard-coded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from evidence_train import SIZES, TAU_OPT, load_family, plan, run_plan  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import (  # noqa: E402
    Summary,
    make_sweep,
    markdown_table,
    plot_compute_regret,
    replay,
    spearman,
    write_summary_csv,
)
from collapse_hpo.predictors.curves import Curve, write_curves_csv  # noqa: E402
from collapse_hpo.predictors.schedules import Schedule  # noqa: E402

REPO = HERE.parents[1]
FRACTIONS = (0.1, 0.2, 0.25, 0.3, 0.5, 0.75)
SWEEP_FAMILIES = ("lr_tau", "lr_lambda", "bs_tau", "bs_lambda")
REPLAY_REPORTS = 50  # report points per trial in the replays (every 2% of training)


def log(msg: str) -> None:
    """Progress on stderr (the figures go to the markdown/JSON outputs and stdout)."""
    print(msg, file=sys.stderr, flush=True)


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


CALIBRATE_FOLDS = {"full": 5, "small": 2}
_FOLDS = [5]


def _calibrate(curves: list[Curve]):
    """predictors.calibrate on reference curves (held-out folds for the error model: 5 full, 2 small)."""
    from collapse_hpo.predictors.calibrate import calibrate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibrate(curves, folds=_FOLDS[0])


def _by_seed(curves: list[Curve]) -> dict[int, list[Curve]]:
    out: dict[int, list[Curve]] = {}
    for c in curves:
        out.setdefault(int(c.meta["seed"]), []).append(c)
    return out


# ------------------------------------------------------------------------------------------------ replay
def ordering(curves: list[Curve], surrogate, fractions=FRACTIONS) -> dict[str, dict[float, float]]:
    """Spearman ρ against the final loss of the predicted final loss and of the current loss, at each p."""
    from collapse_hpo.predictors.predict import predict_final_loss

    finals = [c.final_loss for c in curves]
    pred_rho, cur_rho = {}, {}
    for p in fractions:
        preds, cur = [], []
        for c in curves:
            t = c.truncated(p)
            ok = np.isfinite(t.loss)
            cur.append(float(t.loss[ok][-1]) if ok.any() else math.nan)
            if surrogate is None:
                preds.append(math.nan)
                continue
            pr = predict_final_loss(
                t.t_hat[ok],
                t.loss[ok],
                surrogate=surrogate,
                schedule=c.schedule,
                tau=c.tau,
                tpp=c.tpp,
                min_fraction=min(0.05, p),
            )
            preds.append(pr.final_loss if pr.ok else math.nan)
        pred_rho[p] = spearman(preds, finals)
        cur_rho[p] = spearman(cur, finals)
    return {"predicted": pred_rho, "current": cur_rho}


def part_replay(size: str, cache: Path, out: Path, orders: int, workers: int, results: dict) -> list[Summary]:
    """Replay every sweep through every pruner; ordering stability; table + plot."""
    ref_curves = load_family(cache, "collapse_tau") + load_family(cache, "collapse_lambda")
    surrogate = None
    if ref_curves:
        cal = _calibrate(ref_curves)
        surrogate = cal.surrogate
        results["reference"] = {
            "runs": len(ref_curves),
            "mean_mae_paper": cal.mean_mae_paper,
            "surrogate": surrogate.to_dict(),
            "notes": cal.notes,
        }
        log(
            f"reference surrogate: calibrated on {len(ref_curves)} collapse-family runs, "
            f"MAE {100 * cal.mean_mae_paper:.2f}%"
        )
    # collapse-online refits the surrogate whenever a trial completes (seconds each): external sweeps only
    skip = {"collapse-online"} | (set() if surrogate is not None else set(peers.REFERENCE_PRUNERS))
    names = [n for n in peers.available_names() if n not in skip]
    summaries: list[Summary] = []
    results["replay"], results["ordering"] = {}, {}
    planned: dict[tuple[str, int], int] = {}
    for r in plan(size):
        if r.family in SWEEP_FAMILIES:
            key = (r.family, int(r.meta["seed"]))
            planned[key] = planned.get(key, 0) + 1
    results["incomplete_sweeps"] = {}
    for fam in SWEEP_FAMILIES:
        for seed, curves in sorted(_by_seed(load_family(cache, fam)).items()):
            if len(curves) < planned.get((fam, seed), 0):  # a sweep cut short by the deadline: not replayed
                results["incomplete_sweeps"][f"{fam}_s{seed}"] = f"{len(curves)}/{planned[(fam, seed)]} runs"
                log(f"{fam}_s{seed}: only {len(curves)} of {planned[(fam, seed)]} runs trained; not replayed")
                continue
            label = f"{fam}_s{seed}"
            sweep = make_sweep(curves, n_reports=REPLAY_REPORTS, name=label, source=label)
            t0 = time.perf_counter()
            factories = [peers.factory(n, surrogate=surrogate) for n in names]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sums, _ = replay(sweep, factories, orders=orders, workers=workers, seed=seed)
            summaries += sums
            results["replay"][label] = [s.row() for s in sums]
            results["ordering"][label] = ordering(curves, surrogate)
            best = curves[int(np.argmin([c.final_loss for c in curves]))]
            results["replay"][label + "_best"] = {"run": best.run, "final_loss": best.final_loss, **best.meta}
            log(
                f"replayed {label}: {len(curves)} trials, {len(names)} pruners, {orders} orders in "
                f"{time.perf_counter() - t0:.0f} s"
            )
    if summaries:
        write_summary_csv(out / f"replay_{size}.csv", summaries)
        for fam in SWEEP_FAMILIES:
            sel = [s for s in summaries if s.sweep.startswith(fam + "_")]
            if sel:
                plot_compute_regret(
                    out / f"replay_{fam}_{size}.png",
                    sel,
                    title=f"{fam}: compute vs regret ({orders} orders, {workers} workers)",
                )
    return summaries


def plot_sweep_curves(path: Path, families: dict[str, list[Curve]], key: str) -> None:
    """Raw curves of sweeps (one panel per family), colored by the varied hyperparameter."""
    from collapse_hpo.hpo.figures import pyplot, save_png

    plt = pyplot()

    fams = [f for f in families if families[f]]
    if not fams:
        return
    fig, axes = plt.subplots(1, len(fams), figsize=(5 * len(fams), 4), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        cs = families[fam]
        vals = np.array([c.meta[key] for c in cs], dtype=float)
        lo, hi = np.log(vals.min()), np.log(vals.max())
        for c, v in zip(cs, vals):
            ax.plot(c.t_hat, c.loss, color=plt.cm.viridis((np.log(v) - lo) / max(hi - lo, 1e-9)), lw=0.8)
        ax.set_title(f"{fam} ({key} colored, {len(cs)} runs)")
        ax.set_xlabel("t̂ (fraction of training tokens)")
        ax.set_ylabel("training loss")
        finals = [c.final_loss for c in cs]
        ax.set_ylim(min(finals) * 0.97, np.percentile([np.nanmax(c.loss[c.t_hat > 0.1]) for c in cs], 90))
    fig.tight_layout()
    save_png(fig, path, dpi=110)


# ------------------------------------------------------------------------------------------------ collapse
def part_collapse(size: str, cache: Path, out: Path, results: dict) -> None:
    """Δ per family, Δ/σ, held-out MAE, normalized-curve plot."""
    from collapse_hpo.predictors.collapse import normalize, spread, supercollapse

    fams = {f: load_family(cache, f) for f in ("collapse_tau", "collapse_lambda")}
    if not fams["collapse_tau"]:
        return
    # the smallest width's λ-fixed run is the τ-optimal one (same config): share it
    wmin = min(c.meta["width"] for c in fams["collapse_tau"])
    fams["collapse_lambda"] = [c for c in fams["collapse_tau"] if c.meta["width"] == wmin] + fams[
        "collapse_lambda"
    ]
    res: dict[str, Any] = {}
    smooth = 0.02
    for fam, curves in fams.items():
        seeds = _by_seed(curves)
        r: dict[str, Any] = {"widths": sorted({c.meta["width"] for c in curves}), "seeds": sorted(seeds)}
        r["tau"] = {str(c.meta["width"]): c.tau for c in curves if c.meta["seed"] == min(seeds)}
        per_seed = {}
        for s, cs in seeds.items():
            if len(cs) >= 2:
                sp = spread(cs, smooth_width=smooth)
                per_seed[s] = {"delta_mean": sp.mean, "delta_max": sp.max}
                big = [c for c in cs if c.meta["width"] != wmin]
                if len(big) >= 2:  # secondary view: without the smallest width
                    per_seed[s]["delta_mean_without_smallest"] = spread(big, smooth_width=smooth).mean
        r["per_seed"] = per_seed
        key = "delta_mean_without_smallest"
        vals = [v[key] for v in per_seed.values() if key in v]
        if vals:
            r["delta_mean_without_smallest"] = float(np.mean(vals))
        if per_seed:
            r["delta_mean"] = float(np.mean([v["delta_mean"] for v in per_seed.values()]))
            r["delta_max"] = float(np.mean([v["delta_max"] for v in per_seed.values()]))
        groups: dict[int, list[Curve]] = {}
        for c in curves:
            groups.setdefault(c.meta["width"], []).append(c)
        if len(groups) >= 2 and any(len(g) >= 2 for g in groups.values()):
            sc = supercollapse(list(groups.values()), smooth_width=smooth)
            r["delta_seed_avg"] = sc.spread.mean
            r["sigma_mean"] = sc.noise.mean
            r["delta_over_sigma"] = sc.ratio_mean
        res[fam] = r
    # held-out size: calibrate on the other widths of the τ-optimal family, test on the largest
    tau_curves = fams["collapse_tau"]
    wmax = max(c.meta["width"] for c in tau_curves)
    train = [c for c in tau_curves if c.meta["width"] != wmax]
    test = [c for c in tau_curves if c.meta["width"] == wmax]
    if train and test:
        from collapse_hpo.predictors.predict import predict_final_loss

        cal = _calibrate(train)
        sur = cal.surrogate
        maes, errs = [], {p: [] for p in (0.1, 0.2, 0.3)}
        for c in test:
            t, ell = normalize(c, smooth_width=smooth)
            sel = t >= 0.2
            maes.append(float(np.mean(np.abs(ell[sel] - sur.normalized(t[sel], c.schedule, c.tau, c.tpp)))))
            for p in errs:
                tr = c.truncated(p)
                pr = predict_final_loss(
                    tr.t_hat, tr.loss, surrogate=sur, schedule=c.schedule, tau=c.tau, tpp=c.tpp
                )
                errs[p].append(pr.final_loss / c.final_loss - 1 if pr.ok else math.nan)
        res["held_out"] = {
            "width": wmax,
            "params": test[0].meta.get("params_non_embedding"),
            "fit_widths": sorted({c.meta["width"] for c in train}),
            "fit_mae_paper": cal.mean_mae_paper,
            "mae": float(np.mean(maes)),
            "mae_per_seed": maes,
            "final_loss_error": {str(p): v for p, v in errs.items()},
        }
    results["collapse"] = res
    plot_collapse(out / f"collapse_{size}.png", fams, smooth)


def plot_collapse(path: Path, fams: dict[str, list[Curve]], smooth: float) -> None:
    """Normalized curves ℓ = L/L(1) of both families, colored by width (the paper's Fig. 1, small)."""
    from collapse_hpo.hpo.figures import pyplot, save_png
    from collapse_hpo.predictors.collapse import normalize

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    widths = sorted({c.meta["width"] for cs in fams.values() for c in cs})
    for ax, (fam, cs) in zip(axes, fams.items()):
        for c in cs:
            t, ell = normalize(c, smooth_width=smooth)
            k = widths.index(c.meta["width"])
            ax.plot(
                t,
                ell,
                color=plt.cm.plasma(k / max(len(widths) - 1, 1)),
                lw=0.9,
                label=f"w{c.meta['width']} ({c.meta.get('params_non_embedding')} params), τ={c.tau:.3g}"
                if c.meta["seed"] == min(x.meta["seed"] for x in cs)
                else None,
            )
        ax.set_title(f"{fam}: L/L(1), 20 TPP")
        ax.set_xlabel("t̂ (fraction of training tokens)")
        ax.set_ylim(0.98, 1.35)
        ax.set_xlim(0.1, 1.0)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("normalized loss ℓ")
    fig.tight_layout()
    save_png(fig, path, dpi=110)


# ------------------------------------------------------------------------------------------------ alarm
def _split(curves: list[Curve], n_cal: int) -> tuple[list[Curve], list[Curve]]:
    cs = sorted(curves, key=lambda c: c.meta["seed"])
    return cs[:n_cal], cs[n_cal:]


def part_alarm(size: str, cache: Path, out: Path, results: dict) -> None:
    """Choose the deviation rule and the raw-loss rule on calibration runs; measure on test runs.

    Clean runs are split into calibration (the first third by seed) and test runs; so is each fault family
    (``alarm_fault``: strength 1; ``alarm_medium``, ``alarm_weak``: weaker faults). Thresholds come from the
    clean calibration runs only (1.25 × the largest persistent statistic any of them reached); among the
    candidate settings (align window, persistence, smoothing) the one that detects most faulty calibration
    runs earliest wins.
    Rates are then measured on the test runs. Reference: the smallest τ-optimal family run (same controls).
    """
    from collapse_hpo.predictors.residuals import (
        AlarmRule,
        choose_threshold,
        normalized_reference,
        persistent_peak,
        raw_loss_alarm,
        residuals,
        rise_series,
    )

    clean = load_family(cache, "alarm_clean")
    refs = load_family(cache, "collapse_tau")
    if not clean or not refs:
        return
    wmin = min(c.meta["width"] for c in refs)
    ref_run = sorted([c for c in refs if c.meta["width"] == wmin], key=lambda c: c.meta["seed"])[0]
    cal_clean, test_clean = _split(clean, max(2, len(clean) // 3))
    # ℓ_ref: one run at the same controls (a mean over the clean calibration runs would leak them into the
    # thresholds, which are chosen on those same runs: tried, it gave more false alarms on the test runs)
    ref = normalized_reference(ref_run.t_hat, ref_run.loss, smooth=0.02)

    families = (("alarm_fault", "alarm"), ("alarm_medium", "alarm_medium"), ("alarm_weak", "alarm_weak"))
    for fam, key in families:
        fault = load_family(cache, fam)
        if not fault:
            continue
        cal_fault, test_fault = _split(fault, max(1, len(fault) // 3))
        candidates = []
        for align in ((0.1, 0.3), (0.2, 0.38)):
            for persistence in (2, 3, 5):
                for smooth in (0.02, 0.05):
                    base = AlarmRule(align=align, threshold=1.0, persistence=persistence, smooth=smooth)
                    peak = [
                        persistent_peak(residuals(c.t_hat, c.loss, *ref, base).residual, persistence)
                        for c in cal_clean
                    ]
                    rule = AlarmRule(
                        align=align,
                        threshold=choose_threshold(peak, safety=1.25),
                        persistence=persistence,
                        smooth=smooth,
                    )
                    fired = [residuals(c.t_hat, c.loss, *ref, rule).alarm for c in cal_fault]
                    det = [a.t_hat if a.fired else 1.0 for a in fired]
                    candidates.append((float(np.mean(det)), rule, sum(a.fired for a in fired)))
        candidates.sort(key=lambda x: (-x[2], x[0]))
        rule = candidates[0][1]
        raw_cands = []
        for persistence in (2, 3, 5):
            for smooth in (0.02, 0.05):
                peak = [
                    persistent_peak(rise_series(c.t_hat, c.loss, smooth=smooth)[1], persistence)
                    for c in cal_clean
                ]
                margin = choose_threshold(peak, safety=1.25, floor=1e-3)
                fired = [
                    raw_loss_alarm(c.t_hat, c.loss, margin=margin, persistence=persistence, smooth=smooth)
                    for c in cal_fault
                ]
                det = [a.t_hat if a.fired else 1.0 for a in fired]
                raw_cands.append(
                    (float(np.mean(det)), (margin, persistence, smooth), sum(a.fired for a in fired))
                )
        raw_cands.sort(key=lambda x: (-x[2], x[0]))
        margin, rp, rs = raw_cands[0][1]

        def measure(cs: list[Curve], rule=rule, margin=margin, rp=rp, rs=rs) -> list[dict[str, Any]]:
            rows = []
            for c in cs:
                a = residuals(c.t_hat, c.loss, *ref, rule).alarm
                b = raw_loss_alarm(c.t_hat, c.loss, margin=margin, persistence=rp, smooth=rs)
                rows.append(
                    {"run": c.run, "width": c.meta["width"], "alarm_t_hat": a.t_hat, "raw_t_hat": b.t_hat}
                )
            return rows

        tc, tf = measure(test_clean), measure(test_fault)
        start = float(fault[0].meta.get("fault_t_hat", 0.0))
        # on a faulty run, an alarm before the fault starts is a false alarm, not a detection
        early = sum(r["alarm_t_hat"] is not None and r["alarm_t_hat"] < start for r in tf)
        early_raw = sum(r["raw_t_hat"] is not None and r["raw_t_hat"] < start for r in tf)
        det = [None if a is None or a < start else a for a in (r["alarm_t_hat"] for r in tf)]
        raw = [None if b is None or b < start else b for b in (r["raw_t_hat"] for r in tf)]
        # a rule that never fires counts as t̂ = 1 (the end of training) in the lead
        lead = [(1.0 if b is None else b) - (1.0 if a is None else a) for a, b in zip(det, raw)]
        results[key] = {
            "faults": fam,
            "fault": fault[0].meta.get("fault"),
            "reference": ref_run.run,
            "rule": {
                "align": list(rule.align),
                "threshold": rule.threshold,
                "persistence": rule.persistence,
                "smooth": rule.smooth,
            },
            "raw_rule": {"margin": margin, "persistence": rp, "smooth": rs},
            "calibration": {"clean": [c.run for c in cal_clean], "fault": [c.run for c in cal_fault]},
            "test_clean": tc,
            "test_fault": tf,
            "false_alarms": sum(r["alarm_t_hat"] is not None for r in tc),
            "false_alarms_raw": sum(r["raw_t_hat"] is not None for r in tc),
            "alarms_before_fault": early,
            "alarms_before_fault_raw": early_raw,
            "n_clean": len(tc),
            "n_fault": len(tf),
            "detected": sum(a is not None for a in det),
            "detected_raw": sum(b is not None for b in raw),
            "median_alarm_t_hat": float(np.median([1.0 if a is None else a for a in det])),
            "median_raw_t_hat": float(np.median([1.0 if b is None else b for b in raw])),
            "median_lead": float(np.median(lead)),
            "min_lead": float(np.min(lead)),
        }
        plot_alarm(out / f"{key}_{size}.png", test_clean, test_fault, ref, rule)


def plot_alarm(path: Path, clean: list[Curve], fault: list[Curve], ref, rule) -> None:
    """Residual r(t̂) of the test runs, clean and faulty, with the chosen threshold."""
    from collapse_hpo.hpo.figures import pyplot, save_png

    plt = pyplot()

    from collapse_hpo.predictors.residuals import residuals

    fig, ax = plt.subplots(figsize=(7, 4))
    for cs, color, lab in ((clean, "tab:blue", "clean"), (fault, "tab:red", "fault at t̂=0.4")):
        for i, c in enumerate(cs):
            r = residuals(c.t_hat, c.loss, *ref, rule)
            ax.plot(r.t_hat, r.residual, color=color, lw=0.7, alpha=0.7, label=lab if i == 0 else None)
    ax.axhline(rule.threshold, color="k", ls="--", lw=0.8, label=f"threshold {rule.threshold:.4f}")
    ax.axvline(0.4, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("t̂")
    ax.set_ylabel("residual r = L/c − ℓ_ref")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


# ------------------------------------------------------------------------------------------------ external
def mpl_curves(root: Path, size: int) -> list[Curve]:
    """mpl_luo2025 runs at one size whose schedules end at 24,000 steps, as Curves (t̂ = step / 24,000)."""
    import pandas as pd

    out = []
    for name in ("cosine_24000", "constant_24000", "wsd_20000_24000", "wsdld_20000_24000"):
        f = root / f"csv_{size}" / f"{name}.csv"
        if not f.exists():
            continue
        df = pd.read_csv(f)
        t = df.step.to_numpy(float) / 24000.0
        lr = df.lr.to_numpy(float)
        sched = Schedule.from_data(t, lr / lr.max())
        out.append(
            Curve(
                run=f"mpl{size}_{name}",
                t_hat=t,
                loss=df.loss.to_numpy(float),
                lr=lr,
                schedule=sched,
                tau=None,
                tpp=1.0,
                meta={"size": size, "seed": 0},
            )
        )
    return out


def qiu_chess_curves(root: Path, seed: int = 0) -> tuple[list[Curve], list[float]]:
    """qiu_supercollapse chess runs of one seed (8 widths), t̂ = compute / final compute; weights = compute."""
    import pandas as pd

    runs = pd.read_csv(root / "chess_runs.csv")
    runs = runs[runs.seed == seed]
    curves_df = pd.read_csv(root / "chess_curves.csv.gz", usecols=["run_id", "compute", "test_loss", "lr"])
    out, weights = [], []
    for _, r in runs.sort_values("D").iterrows():
        g = curves_df[curves_df.run_id == r.run_id]
        g = g[g.compute > 0]
        t = g.compute.to_numpy(float) / float(g.compute.max())
        lr = g.lr.to_numpy(float)
        sched = Schedule.from_data(t, lr / lr.max())
        out.append(
            Curve(
                run=f"chess_D{int(r.D)}_s{seed}",
                t_hat=t,
                loss=g.test_loss.to_numpy(float),
                lr=lr,
                schedule=sched,
                tau=None,
                tpp=float(r.tpp_final),
                meta={"width": int(r.D), "seed": seed},
            )
        )
        weights.append(float(r.opt_C))
    return out, weights


ONLINE_ORDERS = 5  # collapse-online refits as trials complete: fewer orders (the first of the same)


def _replay_mixed(sweep, names: list[str], surrogate, orders: int, workers: int) -> list[Summary]:
    """Replay ``names``; collapse-online on the first ``ONLINE_ORDERS`` of the same trial orders only."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in names:
            k = min(orders, ONLINE_ORDERS) if n == "collapse-online" else orders
            fac = [peers.factory(n, surrogate=surrogate)]
            sums, _ = replay(sweep, fac, orders=k, workers=workers, seed=0)
            out += sums
    return out


def part_external(
    size: str, extdata: Path, out: Path, orders: int, workers: int, results: dict
) -> list[Summary]:
    """Replays of the external sweeps that can be formed."""
    summaries: list[Summary] = []
    res: dict[str, Any] = {}
    names_online = [n for n in peers.available_names() if n not in peers.REFERENCE_PRUNERS]
    mpl_root = extdata / "mpl_luo2025"
    if mpl_root.is_dir():
        sizes = (25, 100, 400)
        allc = {s: mpl_curves(mpl_root, s) for s in sizes}
        for s in sizes if size == "full" else (400,):
            curves = allc[s]
            if len(curves) < 3:
                continue
            ref = [c for t, cs in allc.items() if t != s for c in cs]
            sur = _calibrate(ref).surrogate
            sweep = make_sweep(curves, n_reports=REPLAY_REPORTS, name=f"mpl_{s}M", source=str(mpl_root))
            sums = _replay_mixed(sweep, peers.available_names(), sur, orders, min(workers, 2))
            summaries += sums
            res[f"mpl_{s}M"] = {
                "trials": [c.run for c in curves],
                "finals": [c.final_loss for c in curves],
                "rows": [x.row() for x in sums],
                "ordering": ordering(curves, sur, (0.1, 0.25, 0.5, 0.75, 0.85)),
            }
            log(f"replayed mpl_{s}M ({len(curves)} schedules)")
    qiu_root = extdata / "qiu_supercollapse"
    if qiu_root.is_dir() and (qiu_root / "chess_curves.csv.gz").exists():
        curves, weights = qiu_chess_curves(qiu_root, 0)
        sweep = make_sweep(
            curves, n_reports=REPLAY_REPORTS, weights=weights, name="qiu_chess_s0", source=str(qiu_root)
        )
        sums = _replay_mixed(sweep, names_online, None, orders, workers)
        summaries += sums
        res["qiu_chess_s0"] = {
            "trials": [c.run for c in curves],
            "finals": [c.final_loss for c in curves],
            "rows": [x.row() for x in sums],
        }
        log(f"replayed qiu chess ({len(curves)} widths)")
    elif not qiu_root.is_dir() and not mpl_root.is_dir():
        log(f"external: {extdata} has neither mpl_luo2025 nor qiu_supercollapse; part skipped")
    results["external"] = res
    if summaries:
        write_summary_csv(out / f"replay_external_{size}.csv", summaries)
        plot_compute_regret(out / f"replay_external_{size}.png", summaries, title="external sweeps")
    return summaries


# ------------------------------------------------------------------------------------------------ report
def export_curves(size: str, cache: Path, out: Path, command: str) -> dict[str, str]:
    """One curve CSV per trained family in ``out`` (the artefacts) and the command that made them."""
    fams = sorted({r.family for r in plan(size)})
    written = {}
    for fam in fams:
        cs = load_family(cache, fam)
        if cs:
            path = out / f"curves_{fam}_{size}.csv"
            write_curves_csv(path, cs)
            written[fam] = path.name
    rows = ["run,family,width,params_non_embedding,total_tokens,batch_tokens,lr,weight_decay,tau,seed,fault"]
    for r in plan(size):
        js = cache / f"{r.name}.json"
        if not js.exists():
            continue
        md = json.loads(js.read_text())["metadata"]
        fault = ""
        if r.fault is not None:
            fault = f"{r.fault['kind']}@{r.fault['start_t_hat']}x{r.fault.get('strength', 1.0)}"
        rows.append(
            f"{r.name},{r.family},{r.config['width']},{md['params_non_embedding']},{md['total_tokens']},"
            f"{md['batch_tokens']},{md['lr']:.6g},{md['weight_decay']:.6g},"
            f"{'' if md['tau'] is None else format(md['tau'], '.6g')},{md['seed']},{fault}"
        )
    _atomic_write(out / f"runs_{size}.csv", "\n".join(rows) + "\n")
    for f in written.values():
        os.chmod(out / f, 0o644)
    _atomic_write(
        out / f"curves_{size}.COMMAND.txt",
        f"{command}\n# curves_<family>_{size}.csv: one complete run per trial; run names as in the plan "
        f"of studies/bench/evidence_train.py (size {size!r}).\n",
    )
    return written


def _fmt_rho(d: dict) -> str:
    return " ".join(
        f"{float(p):g}:{'-' if v is None or not math.isfinite(v) else format(v, '.2f')}" for p, v in d.items()
    )


def report_md(size: str, results: dict, summaries: list[Summary], ext: list[Summary], command: str) -> str:
    """The markdown report of one run of the benchmark."""
    L = [
        f"# Evidence benchmark, size `{size}`",
        "",
        f"Command: `{command}`",
        "",
        f"Finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"wall time {results['seconds']:.0f} s.",
        "",
    ]
    tr = results.get("training", {})
    if tr:
        L += [
            f"Training: {tr['runs_cached']} runs available of {tr['runs_planned']} planned; failed: "
            f"{tr['failed'] or 'none'}.",
            "",
        ]
    if results.get("incomplete_sweeps"):
        L += [f"Sweeps not replayed (training incomplete): {results['incomplete_sweeps']}", ""]
    if summaries:
        L += ["## Replay of the sweeps", "", markdown_table(summaries), ""]
        for label, rho in results.get("ordering", {}).items():
            L.append(
                f"- ordering `{label}`: ρ(predicted, final) {_fmt_rho(rho['predicted'])}; "
                f"ρ(current, final) {_fmt_rho(rho['current'])}"
            )
        L.append("")
    if "collapse" in results:
        c = results["collapse"]
        L += ["## Collapse", ""]
        for fam in ("collapse_tau", "collapse_lambda"):
            if fam in c:
                r = c[fam]
                L.append(
                    f"- `{fam}` widths {r['widths']} seeds {r['seeds']}: "
                    f"Δ mean {r.get('delta_mean', math.nan):.4f} (without the smallest width "
                    f"{r.get('delta_mean_without_smallest', math.nan):.4f})"
                    f", Δ max {r.get('delta_max', math.nan):.4f}; Δ(seed-avg)/σ "
                    f"{r.get('delta_over_sigma', math.nan):.2f} (σ {r.get('sigma_mean', math.nan):.4f}); τ "
                    f"{ {k: round(v, 4) for k, v in r['tau'].items()} }"
                )
        if "held_out" in c:
            h = c["held_out"]
            L.append(
                f"- held-out width {h['width']} ({h['params']} params), fit on {h['fit_widths']}: MAE "
                f"{100 * h['mae']:.2f}% (fit MAE {100 * h['fit_mae_paper']:.2f}%); final-loss error "
                f"{ {p: [round(100 * x, 2) for x in v] for p, v in h['final_loss_error'].items()} } %"
            )
        L.append("")
    for key in ("alarm", "alarm_medium", "alarm_weak"):
        if key not in results:
            continue
        a = results[key]
        L += [
            f"## Bug alarm: `{a['faults']}` (fault {a['fault']})",
            "",
            f"- rule (chosen on {len(a['calibration']['clean'])} clean + "
            f"{len(a['calibration']['fault'])} faulty "
            f"calibration runs): {a['rule']}; raw-loss rule {a['raw_rule']}",
            f"- test: false alarms {a['false_alarms']}/{a['n_clean']} clean runs (raw-loss rule "
            f"{a['false_alarms_raw']}/{a['n_clean']}); detected {a['detected']}/{a['n_fault']} faulty runs "
            f"(raw {a['detected_raw']}/{a['n_fault']}); median alarm t̂ {a['median_alarm_t_hat']:.3f} vs raw "
            f"{a['median_raw_t_hat']:.3f}; lead median {a['median_lead']:.3f}, min {a['min_lead']:.3f}; "
            f"alarms before the fault on faulty runs {a['alarms_before_fault']} (raw "
            f"{a['alarms_before_fault_raw']})",
            "",
        ]
    if ext:
        L += ["## External sweeps", "", markdown_table(ext), ""]
        for k, v in results.get("external", {}).items():
            if "ordering" in v:
                L.append(
                    f"- ordering `{k}`: ρ(predicted, final) {_fmt_rho(v['ordering']['predicted'])}; "
                    f"ρ(current, final) {_fmt_rho(v['ordering']['current'])}"
                )
        L.append("")
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the report; write artefacts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument(
        "--parts", default="train,replay,collapse,alarm,external", help="comma-separated parts (default all)"
    )
    ap.add_argument("--cache", default=None, help="run cache (default results/evidence/<size>)")
    ap.add_argument("--out", default=None, help="artefact folder (default studies/bench/artifacts)")
    ap.add_argument("--workers", type=int, default=2, help="training processes (1 torch thread each)")
    ap.add_argument("--orders", type=int, default=None, help="replay orders (default 20 full, 3 small)")
    ap.add_argument(
        "--workers-replay", type=int, default=4, help="concurrent trials in the replays (default 4)"
    )
    ap.add_argument(
        "--extdata",
        default=str(REPO.parent / "shared" / "extdata"),
        help="external data folder (default ../shared/extdata next to the repository)",
    )
    ap.add_argument("--deadline-minutes", type=float, default=None, help="start no training run after this")
    args = ap.parse_args(argv)
    command = "python studies/bench/evidence.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.time()
    parts = set(args.parts.split(","))
    cache = Path(args.cache or REPO / "results" / "evidence" / args.size)
    out = Path(args.out or HERE / "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    orders = args.orders or (20 if args.size == "full" else 3)
    _FOLDS[0] = CALIBRATE_FOLDS.get(args.size, 5)
    results: dict[str, Any] = {"size": args.size, "command": command, "tau_opt": TAU_OPT}
    runs = plan(args.size)
    if "train" in parts and runs:
        deadline = None if args.deadline_minutes is None else t0 + 60 * args.deadline_minutes
        failed = run_plan(runs, cache, workers=args.workers, deadline=deadline, log=log)
        results["training"] = {"failed": failed}
    if runs and cache.is_dir():
        n_cached = sum((cache / f"{r.name}.json").exists() for r in runs)
        results.setdefault("training", {"failed": []}).update(runs_planned=len(runs), runs_cached=n_cached)
        results["artefacts"] = export_curves(args.size, cache, out, command)
        sweeps = {
            f: [c for c in load_family(cache, f) if c.meta["seed"] == min(SIZES[args.size].sweep_seeds)]
            for f in SWEEP_FAMILIES
        }
        plot_sweep_curves(
            out / f"sweeps_lr_{args.size}.png", {f: sweeps[f] for f in ("lr_tau", "lr_lambda")}, "lr"
        )
        plot_sweep_curves(
            out / f"sweeps_bs_{args.size}.png",
            {f: sweeps[f] for f in ("bs_tau", "bs_lambda")},
            "batch_tokens",
        )
    summaries: list[Summary] = []
    ext: list[Summary] = []
    if "replay" in parts and cache.is_dir():
        summaries = part_replay(args.size, cache, out, orders, args.workers_replay, results)
    if "collapse" in parts and cache.is_dir():
        part_collapse(args.size, cache, out, results)
    if "alarm" in parts and cache.is_dir():
        part_alarm(args.size, cache, out, results)
    if "external" in parts:
        ext_root = Path(args.extdata)
        if ext_root.is_dir():
            ext = part_external(args.size, ext_root, out, orders, args.workers_replay, results)
        else:
            log(f"external: {ext_root} not found; part skipped (pass --extdata)")
    results["seconds"] = time.time() - t0
    md = report_md(args.size, results, summaries, ext, command)
    _atomic_write(out / f"evidence_{args.size}.md", md + "\n")
    _atomic_write(out / f"evidence_{args.size}.json", json.dumps(_jsonable(results), indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
