"""Benchmark of ``stages:`` (sweep small, confirm big) against a full sweep at the target width (issue 14).

One command trains three things and prints the figures (also written to ``<out>/stages.json`` and
``<out>/stages.md``):

1. a sweep with stages: stage 1 sweeps ``--trials`` LRs (QMC) at a small width, stage 2 trains its
   ``--top-k`` best at the target width, pruned by the collapse pruner with stage 1's study as reference;
2. the truth: the same settings (stage 1's draws, LR transferred by width₁/width₂ as stage 2 does) at the
   target width, every one trained to the end (grid sampler over those LRs, pruning off), per seed;
3. the same settings at the small width, every one to the end (stage 1 prunes most), per seed: the rank
   agreement of the whole space across sizes.

Figures: Spearman ρ between stage-1 and stage-2 final losses of the settings both trained to the end, and of
stage 1 against the full sweep (all settings stage 1 trained to the end); the regret of the stage-2 winner
(its loss in the full sweep over the full sweep's best, both the mean over seeds); the compute of stages 1+2
as a fraction of the full sweep (N·D: non-embedding params × tokens, and tokens alone). Target: regret ≤ 0.3%
at ≤ 30% of the compute.

    .venv/bin/python studies/bench/stages.py                       # 12 LRs × 2 seeds, widths 16 → 48
    .venv/bin/python studies/bench/stages.py --seeds 0 --trials 8  # quicker
    .venv/bin/python studies/bench/stages.py --full-seeds 0        # the truth from seed 0 only (compute
                                                                   # still counted for both seeds)

Interrupted, the same command continues (each sweep is resumed from its storage).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

#: Batch sizes (tokens) of the batch-size case (``--search batch_tokens``).
BATCH_CHOICES = [256, 512, 1024, 2048, 4096]


def stages_doc(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The sweep file (as a dict) of the sweep with stages."""
    return {
        "name": "bench-stages",
        "model": {"width": args.width, "depth": 2, "heads": 2, "context": 128},
        "tpp": args.tpp,
        "schedule": {"kind": "linear", "warmup": 0.05},
        "tau": "optimal",
        "fixed": {"batch_tokens": args.batch_tokens},
        "space": {"lr": {"type": "float", "low": 3.0e-3, "high": 3.0e-1, "log": True}},
        "trials": args.trials,
        **({} if args.search == "lr" else {  # the failure case: a batch-size grid at a fixed (stage-1) LR
            "fixed": {"lr": args.lr},
            "space": {"batch_tokens": {"type": "categorical", "choices": BATCH_CHOICES}},
            "trials": len(BATCH_CHOICES)}),
        "seeds": list(args.seeds),
        "sampler": {"name": "qmc" if args.search == "lr" else "grid", "seed": 0},
        "stages": [{"width": args.small_width}, {"top_k": args.top_k}],
        "pruner": {"enabled": True, "min_fraction": 0.1, "reference": {"online": True, "min_trials": 3}},
        "resources": {"cpu": 1},
        "executor": {"num_cpus": 2},
        "retries": 1,
        "results": str(out / "stages"),
        "train": {"threads": 1, "val_fractions": [1.0]},
    }


def full_doc(stages: dict[str, Any], draws: list[dict[str, Any]], out: Path, seed: int) -> dict[str, Any]:
    """The full sweep at the target width for one training seed: stage 1's settings transferred, every one
    to the end (one sweep per seed, so a seed can be added later without retraining the others)."""
    doc = json.loads(json.dumps(stages))
    doc.pop("stages")
    doc["name"] = f"bench-full-s{seed}"
    doc["seeds"] = [seed]
    doc["model"]["base_width"] = stages["stages"][0]["width"]
    doc["model"]["base_depth"] = stages["model"]["depth"]
    (key,) = stages["space"]  # one searched hyperparameter: its transferred values, in stage 1's order
    doc["space"] = {key: {"type": "categorical", "choices": [d[key] for d in draws]}}
    if "lr" in doc["fixed"]:
        doc["fixed"]["lr"] = draws[0].get("lr", doc["fixed"]["lr"])
    doc["sampler"] = {"name": "grid", "seed": 0}
    doc.pop("trials")
    doc["pruner"] = {"enabled": False}
    doc["results"] = str(out / f"full-s{seed}")
    return doc


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def by_draw(study: Any) -> dict[int, dict[str, Any]]:
    """Per draw: mean final loss over the seeds trained to the end (None when none was), params."""
    from collapse_hpo.hpo.sweep.stages import draw_scores

    return draw_scores(study)


def nd(study: Any) -> tuple[float, float]:
    """(N·D, tokens) every trial of the study spent."""
    from collapse_hpo.hpo.outputs.report import trial_rows
    from collapse_hpo.hpo.sweep.stages import trial_compute

    tokens = sum(float(r["tokens_trained"] or 0) for r in trial_rows(study))
    return trial_compute(study), tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/bench_stages", help="folder of the sweeps and the figures")
    p.add_argument("--trials", type=int, default=12, help="settings stage 1 sweeps (and the full sweep)")
    p.add_argument("--top-k", type=int, default=3, help="settings stage 2 takes")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds of the stages")
    p.add_argument("--full-seeds", type=int, nargs="+", default=None,
                   help="seeds of the full target-width sweep (default: --seeds); its compute is always "
                   "counted for all of --seeds")
    p.add_argument("--small-width", type=int, default=16)
    p.add_argument("--width", type=int, default=48, help="target width")
    p.add_argument("--tpp", type=float, default=20.0)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--search", choices=("lr", "batch_tokens"), default="lr",
                   help="what stage 1 sweeps: the LR (QMC), or the batch sizes BATCH_CHOICES at --lr (the "
                   "case where the transfer is expected to fail: B's optimum moves with D at fixed TPP)")
    p.add_argument("--lr", type=float, default=0.03, help="stage 1's hidden LR with --search batch_tokens")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    from collapse_hpo.hpo.replays.replay import spearman
    from collapse_hpo.hpo.sweep.config import load_sweep
    from collapse_hpo.hpo.sweep.runner import locate, plan_draws, run_sweep
    from collapse_hpo.hpo.sweep.stages import (
        finish_stages,
        full_sweep_compute,
        run_stages,
        stage_locations,
        stage_sweep,
        transfer_params,
        transfer_rows,
    )

    started = time.time()
    sdoc = stages_doc(args, out)
    sweep = load_sweep(write_yaml(out / "stages.yaml", sdoc))
    locs = stage_locations(sweep)
    resume = (out / "stages" / "study.db").exists()
    studies = run_stages(sweep, resume=resume)
    finish_stages(sweep, locs, list(studies))
    t_stages = time.time() - started

    draws = plan_draws(stage_sweep(sweep, 0))
    moved = [transfer_params(sweep, {**stage_sweep(sweep, 0).fixed, **d}) for d in draws]
    moved = [{k: v for k, v in m.items() if k in sdoc["space"] or k == "lr"} for m in moved]
    full_seeds = list(args.full_seeds if args.full_seeds is not None else args.seeds)
    per_seed: list[dict[int, dict[str, Any]]] = []
    full_tokens = []
    for seed in full_seeds:
        full = load_sweep(write_yaml(out / f"full-s{seed}.yaml", full_doc(sdoc, moved, out, seed)))
        fstudy = run_sweep(full, locate(full), resume=(out / f"full-s{seed}" / "study.db").exists())
        per_seed.append(by_draw(fstudy))
        full_tokens.append(nd(fstudy)[1])
    # Stage 1's settings at the small width, every one to the end (stage 1 prunes most of them): the rank
    # agreement of the whole space across sizes, against the full target-width sweep, seed by seed.
    small_losses: list[dict[int, Any]] = []
    for seed in full_seeds:
        sd = stage_sweep(sweep, 0).to_jsonable()
        sd.pop("source")
        sd.update(name=f"bench-small-s{seed}", seeds=[seed], results=str(out / f"small-s{seed}"),
                  pruner={"enabled": False})
        small = load_sweep(write_yaml(out / f"small-s{seed}.yaml", sd))
        sstudy = run_sweep(small, locate(small), resume=(out / f"small-s{seed}" / "study.db").exists())
        small_losses.append(by_draw(sstudy))
    t_all = time.time() - started

    s1 = by_draw(studies[0])
    rows = transfer_rows(sweep, studies[0], studies[1])
    # full-sweep draw d = stage-1 draw d (grid order); the mean over the full sweep's seeds
    full_loss: dict[int, float | None] = {}
    for d in range(len(draws)):
        vals = [ps[d]["final_loss"] for ps in per_seed if d in ps and ps[d]["final_loss"] is not None]
        full_loss[d] = sum(vals) / len(vals) if len(vals) == len(per_seed) else None
    best_full = min(v for v in full_loss.values() if v is not None)
    best_full_draw = min((d for d in full_loss if full_loss[d] is not None), key=lambda d: full_loss[d])
    done2 = [r for r in rows if r["final_loss_2"] is not None]
    winner = min(done2, key=lambda r: r["final_loss_2"])
    win_draw = int(winner["stage1_draw"])
    regret = (full_loss[win_draw] - best_full) / best_full
    both12 = [(r["final_loss_1"], r["final_loss_2"]) for r in done2 if r["final_loss_1"] is not None]
    rho12 = spearman([a for a, _ in both12], [b for _, b in both12])
    common = [d for d in s1 if s1[d]["final_loss"] is not None and full_loss.get(d) is not None]
    rho1f = spearman([s1[d]["final_loss"] for d in common], [full_loss[d] for d in common])
    scored = [d for d in s1 if full_loss.get(d) is not None]
    rho1f_score = spearman([s1[d]["score"] for d in scored], [full_loss[d] for d in scored])
    small_loss: dict[int, float | None] = {}
    for d in range(len(draws)):
        vals = [ps[d]["final_loss"] for ps in small_losses if d in ps and ps[d]["final_loss"] is not None]
        small_loss[d] = sum(vals) / len(vals) if len(vals) == len(small_losses) else None
    both_sf = [d for d in small_loss if small_loss[d] is not None and full_loss.get(d) is not None]
    rho_sf = spearman([small_loss[d] for d in both_sf], [full_loss[d] for d in both_sf])
    best_small = min(both_sf, key=lambda d: small_loss[d])  # type: ignore[arg-type,return-value]
    regret_small = (full_loss[best_small] - best_full) / best_full  # type: ignore[operator]
    rho2f = spearman([r["final_loss_2"] for r in done2], [full_loss[int(r["stage1_draw"])] for r in done2])
    c1, c2 = nd(studies[0]), nd(studies[1])
    cf = (full_sweep_compute(sweep, studies[0]), sum(full_tokens) / len(full_tokens) * len(args.seeds))
    frac_nd = (c1[0] + c2[0]) / cf[0]
    frac_tok = (c1[1] + c2[1]) / cf[1]
    top_true = sorted(full_loss, key=lambda d: (full_loss[d] is None, full_loss[d] or 0))[: args.top_k]
    res = {
        "command": "python studies/bench/stages.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "widths": [args.small_width, args.width], "trials": args.trials, "top_k": args.top_k,
        "seeds": list(args.seeds), "full_seeds": full_seeds, "tpp": args.tpp,
        "batch_tokens": args.batch_tokens,
        "stage2_draws": [int(r["stage1_draw"]) for r in rows], "true_top_k": top_true,
        "rho_stage1_stage2": rho12, "n_stage1_stage2": len(both12),
        "rho_stage1_full": rho1f, "n_stage1_full": len(common),
        "rho_stage1_score_full": rho1f_score, "n_stage1_score_full": len(scored),
        "rho_small_full": rho_sf, "n_small_full": len(both_sf), "small_best_draw": best_small,
        "regret_small_best": regret_small,
        "small_losses": {str(d): small_loss[d] for d in sorted(small_loss)},
        "rho_stage2_full": rho2f, "n_stage2_full": len(done2),
        "winner_stage1_draw": win_draw, "winner_full_loss": full_loss[win_draw],
        "best_full_draw": best_full_draw, "best_full_loss": best_full, "regret": regret,
        "compute_nd": {"stage1": c1[0], "stage2": c2[0], "full": cf[0], "fraction": frac_nd},
        "compute_tokens": {"stage1": c1[1], "stage2": c2[1], "full": cf[1], "fraction": frac_tok},
        "full_losses": {str(d): full_loss[d] for d in sorted(full_loss)},
        "stage1_losses": {str(d): s1[d]["final_loss"] for d in sorted(s1)},
        "stage1_scores": {str(d): s1[d]["score"] for d in sorted(s1)},
        "stage2_losses": {str(r["stage1_draw"]): r["final_loss_2"] for r in rows},
        "search": args.search, "draws_stage1": draws, "wall_s": {"stages": t_stages, "total": t_all},
    }
    (out / "stages.json").write_text(json.dumps(res, indent=1))
    md = table(res)
    (out / "stages.md").write_text(md)
    print(md)
    return 0


def _f(x: Any, spec: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(r: dict[str, Any]) -> str:
    """The markdown table of the figures."""
    met_regret = r["regret"] <= 0.003
    met_compute = r["compute_nd"]["fraction"] <= 0.30
    lines = [
        f"widths {r['widths'][0]} → {r['widths'][1]}, {r['trials']} {r['search']} settings × seeds "
        f"{r['seeds']} (full sweep: seeds {r['full_seeds']}), "
        f"top {r['top_k']}, {r['tpp']:g} TPP, B = {r['batch_tokens']}; "
        f"wall {r['wall_s']['total'] / 60:.1f} min",
        "",
        "| figure | value |",
        "|---|---|",
        f"| Spearman ρ stage 1 vs stage 2 (settings both trained to the end) | "
        f"{_f(r['rho_stage1_stage2'], '.2f')} (n = {r['n_stage1_stage2']}) |",
        f"| Spearman ρ stage 1 vs full sweep | {_f(r['rho_stage1_full'], '.2f')} "
        f"(n = {r['n_stage1_full']}) |",
        f"| Spearman ρ stage-1 score (pruned: predicted final loss) vs full sweep | "
        f"{_f(r['rho_stage1_score_full'], '.2f')} (n = {r['n_stage1_score_full']}) |",
        f"| Spearman ρ small-width sweep (every setting to the end) vs full sweep | "
        f"{_f(r['rho_small_full'], '.2f')} (n = {r['n_small_full']}) |",
        f"| small-width best (draw) → its regret at the target (no stage 2) | {r['small_best_draw']} → "
        f"{100 * r['regret_small_best']:.2f}% |",
        f"| Spearman ρ stage 2 vs full sweep | {_f(r['rho_stage2_full'], '.2f')} "
        f"(n = {r['n_stage2_full']}) |",
        f"| stage 2 took draws / true top {r['top_k']} | {r['stage2_draws']} / {r['true_top_k']} |",
        f"| stage-2 winner (draw) → its full-sweep loss | {r['winner_stage1_draw']} → "
        f"{r['winner_full_loss']:.4f} |",
        f"| full sweep's best (draw) | {r['best_full_draw']} → {r['best_full_loss']:.4f} |",
        f"| regret (target ≤ 0.3%) | {100 * r['regret']:.2f}% ({'met' if met_regret else 'missed'}) |",
        f"| compute, N·D (target ≤ 30%) | {100 * r['compute_nd']['fraction']:.1f}% "
        f"({'met' if met_compute else 'missed'}): stage 1 {r['compute_nd']['stage1']:.3g} + stage 2 "
        f"{r['compute_nd']['stage2']:.3g} of {r['compute_nd']['full']:.3g} |",
        f"| compute, tokens | {100 * r['compute_tokens']['fraction']:.1f}% |",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
