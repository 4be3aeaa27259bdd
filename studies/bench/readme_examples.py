"""Benchmark: the README's plain-Optuna and Ray Tune examples, swept as users sweep (issue 20, "The README's
own examples"; BENCHMARKS.md, "The README's examples").

The objective and the trainable are the README's own: its python blocks are read from README.md and executed
here (tests/readme_util.py, the reader the tests use), so this script runs what the reader sees, with the
pruner and the scheduler the README builds. Each example is a seeded random search over lr, weight decay λ
and warm-up of a byte-level MLP (numpy), each trial's controls (schedule with its warm-up, τ = 1/(η·λ·steps))
given to the collapse rule. Per sampler seed, the same draws are trained three times:

- ``none``: no pruning (Optuna ``NopPruner``; Tune ``FIFOScheduler``): every trial to the end, whose final
  losses are the truth;
- ``collapse``: the README's ``CollapsePruner`` / ``CollapseScheduler`` as it is (its defaults);
- ``collapse@M`` (with ``--margin M``): the same with its one knob, ``margin``, set to M;
- ``collapse@min_fraction=F`` (with ``--min-fraction F``): the same with ``min_fraction`` set to F (the
  trials' first judgement; BENCHMARKS §21);
- ``sha`` / ``asha``: Optuna's ``SuccessiveHalvingPruner()`` / Tune's ``ASHAScheduler`` at their defaults
  (``max_t`` = the run's optimizer steps, the one setting ASHA needs to know the run's length).

Per rule it prints: compute (optimizer steps trained, as a share of ``none``'s), how often the kept best (the
best completed trial) is ``none``'s best, the mean and worst regret of the kept best (its true final loss over
the true best, in %), and the wall time per sweep. Target (issue 20): at equal or lower regret than SHA/ASHA,
less compute.

``--eval-every N`` runs the examples with a validation loss every N optimizer steps instead of the README's
``EVAL_EVERY`` (its block's line is replaced before it runs; BENCHMARKS §21: every 4 of 200 steps, a loss
every 2% of training, as the README advises).

``--write-curves DIR`` instead trains the Optuna example's draws of each seed with no pruning and writes
their curves to ``DIR/curves_readme_s<seed>.csv`` (``curves_readme_every<N>_s<seed>.csv`` with
``--eval-every N``), for ``collapse-hpo replay`` (BENCHMARKS §36).

``.venv/bin/python studies/bench/readme_examples.py [--part optuna|ray] [--seeds 4] [--trials 20]
[--ray-seeds 3] [--samples 16] [--eval-every N] [--write-curves DIR]`` (about 4 minutes for the Optuna part
and 13 for the Ray part on 2 cores at a load average of 20, at ``nice``; a Tune sweep costs about 1 minute
more than the same Optuna sweep).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the MLP's matrices are small: one BLAS thread per worker
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import argparse
import contextlib
import logging
import re
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from readme_util import readme_blocks

from collapse_hpo.predictors.curves import Curve, write_curves_csv

OPTUNA_HEADING = "## In a plain Optuna objective"
RAY_HEADING = "## In an existing Ray Tune job: `CollapseScheduler`"
NAMESPACE = "readme_bench"  # not "__main__": the blocks' own sweeps (under `if __name__`) do not run


@dataclass(frozen=True)
class Sweep:
    """One sweep's outcome: per draw (the key: its rounded hyperparameters, in draw order) the optimizer steps
    trained, the final loss (None when pruned) and the reason it was stopped ("" if it was not, or the rule
    gives none), and the wall time in seconds."""

    steps: dict[tuple, int]
    final: dict[tuple, float | None]
    reason: dict[tuple, str]
    wall_s: float


def example(kind: str, eval_every: int | None = None) -> dict:
    """A fresh namespace of the README's example (``kind`` "optuna": its plain-Optuna block; "ray": that block
    and the Ray Tune block below it, as the README tells the reader to join them). ``eval_every``: run it
    with ``EVAL_EVERY`` = that many optimizer steps instead of the README's value."""
    ns: dict = {"__name__": NAMESPACE}
    block = readme_blocks(OPTUNA_HEADING)[0]
    if eval_every is not None:
        block, n = re.subn(r"^EVAL_EVERY = \d+", f"EVAL_EVERY = {eval_every}", block, flags=re.MULTILINE)
        if n != 1:
            raise SystemExit("readme_examples: the README's Optuna block has no `EVAL_EVERY = <n>` line "
                             "to set")
    exec(compile(block, "README.md (plain Optuna)", "exec"), ns)
    if kind == "ray":
        exec(compile(readme_blocks(RAY_HEADING)[-1], "README.md (Ray Tune)", "exec"), ns)
    return ns


def key(params: dict) -> tuple:
    """A draw's hyperparameters, rounded, in name order (lr, warmup, weight_decay)."""
    return tuple(round(float(params[k]), 12) for k in sorted(params))


def settings_of(rule: str) -> dict[str, float] | None:
    """The settings of a "collapse@..." rule (the collapse rule with one setting changed: "collapse@M" sets
    ``margin`` to M, "collapse@NAME=V" sets NAME to V), else None."""
    if not rule.startswith("collapse@"):
        return None
    value = rule.split("@", 1)[1]
    name, _, number = value.rpartition("=")
    return {name or "margin": float(number)}


def optuna_sweep(rule: str, seed: int, trials: int, eval_every: int | None = None) -> Sweep:
    ns = example("optuna", eval_every)
    if settings_of(rule) is not None:  # the README's pruner (reference="online") with one setting changed
        from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner

        pruner = CollapsePruner(reference="online", **settings_of(rule))
    else:
        pruner = {"none": optuna.pruners.NopPruner(), "collapse": ns["pruner"],
                  "sha": optuna.pruners.SuccessiveHalvingPruner()}[rule]
    study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=seed))
    start = time.perf_counter()
    study.optimize(ns["objective"], n_trials=trials)
    wall = time.perf_counter() - start
    steps, final, reason = {}, {}, {}
    for t in study.trials:
        k = key(t.params)
        steps[k] = t.last_step or 0
        final[k] = t.value if t.state == optuna.trial.TrialState.COMPLETE else None
        reason[k] = str(t.user_attrs.get("prune_reason", ""))
    return Sweep(steps, final, reason, wall)


def ray_sweep(rule: str, seed: int, trials: int, eval_every: int | None = None) -> Sweep:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    with tempfile.TemporaryDirectory(prefix="readme_bench_") as folder, contextlib.chdir(folder):
        # in its own folder: the README's mirror (sqlite:///tune_mirror.db) is fresh
        ns = example("ray", eval_every)
        steps_total = ns["STEPS"]
        asha = ASHAScheduler(time_attr="step", metric="loss", mode="min", max_t=steps_total)
        if settings_of(rule) is not None:  # the README's scheduler with one setting changed
            from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
            from collapse_hpo.hpo.rule.decision import PruneSettings

            scheduler = CollapseScheduler(
                reference="online", metric="loss", time_attr="step", units="steps", total=steps_total,
                controls=ns["trial_controls"], storage="sqlite:///tune_mirror.db", study_name="char-mlp",
                settings=PruneSettings(**settings_of(rule)))
        else:
            scheduler = {"none": FIFOScheduler(), "collapse": ns["scheduler"], "asha": asha}[rule]
        tuner = tune.Tuner(
            ns["train_fn"], param_space=ns["space"],
            # 2 at a time: the generator's own limit (Tune ignores max_concurrent_trials beside it)
            tune_config=tune.TuneConfig(
                scheduler=scheduler, num_samples=trials,
                search_alg=BasicVariantGenerator(random_state=seed, max_concurrent=2)),
            run_config=tune.RunConfig(name="bench", storage_path=folder, verbose=0),
        )
        start = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - start
    steps, final, reason = {}, {}, {}
    for r in results:
        k = key(r.config)
        steps[k] = int(r.metrics["step"])
        final[k] = float(r.metrics["loss"]) if r.metrics["step"] == steps_total else None
        reason[k] = str(r.metrics.get("collapse_reason", "")) if r.metrics.get("collapse_pruned") else ""
    return Sweep(steps, final, reason, wall)


def true_best(base: Sweep) -> tuple:
    truth = {k: v for k, v in base.final.items() if v is not None}
    return min(truth, key=truth.get)


def score(base: Sweep, run: Sweep) -> tuple[float, bool, float]:
    """Compute share, whether the kept best is the true best, and its regret (%)."""
    if set(run.steps) != set(base.steps):
        raise RuntimeError("the sweeps drew different configurations: the sampler seed did not hold")
    truth = {k: v for k, v in base.final.items() if v is not None}
    best = min(truth, key=truth.get)
    kept = min((k for k, v in run.final.items() if v is not None), key=lambda k: run.final[k])
    compute = sum(run.steps.values()) / sum(base.steps.values())
    return compute, kept == best, 100.0 * (truth[kept] / truth[best] - 1.0)


def bench(part: str, rules: tuple[str, ...], seeds: int, trials: int, eval_every: int | None = None
          ) -> list[str]:
    sweep = optuna_sweep if part == "optuna" else ray_sweep
    rows: dict[str, list[tuple[float, bool, float, float]]] = {r: [] for r in rules}
    for seed in range(seeds):
        base = sweep("none", seed, trials, eval_every)
        rows["none"].append((1.0, True, 0.0, base.wall_s))
        for rule in rules[1:]:
            run = sweep(rule, seed, trials, eval_every)
            rows[rule].append((*score(base, run), run.wall_s))
            c, same, regret = rows[rule][-1][:3]
            print(f"  {part} seed {seed} {rule:9s} compute {c:.2f}  best {'same' if same else 'other'}  "
                  f"regret {regret:.2f}%  wall {run.wall_s:.0f} s (none: {base.wall_s:.0f} s)", flush=True)
            best = true_best(base)
            if not same and run.final[best] is None:
                why = run.reason[best][-300:] or "no reason given"
                print(f"    the best ({', '.join(f'{v:.3g}' for v in best)}) was stopped at step "
                      f"{run.steps[best]}: {why}", flush=True)
    lines = [f"| {part} ({seeds} seeds × {trials} trials) | compute | best same | mean regret | worst regret "
             "| wall / sweep |", "|---|---|---|---|---|---|"]
    for rule, got in rows.items():
        lines.append(
            f"| {rule} | {statistics.mean(g[0] for g in got):.2f} | {sum(g[1] for g in got)}/{len(got)} | "
            f"{statistics.mean(g[2] for g in got):.2f}% | {max(g[2] for g in got):.2f}% | "
            f"{statistics.mean(g[3] for g in got):.0f} s |"
        )
    return lines


def write_curves(path: Path, seed: int, trials: int, eval_every: int | None = None) -> str:
    """Train the README Optuna example's draws for sampler ``seed`` with no pruning and write their curves to
    ``path`` (a curve CSV: run ``readme_s<seed>_t<trial>``, t̂ = step / STEPS, the validation loss, the LR at
    that step from the example's own ``lr_factor``, τ from its ``step_tau``), for ``collapse-hpo replay``.
    Returns a one-line summary."""
    ns = example("optuna", eval_every)
    study = optuna.create_study(pruner=optuna.pruners.NopPruner(),
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    study.optimize(ns["objective"], n_trials=trials)
    steps = ns["STEPS"]
    curves = []
    for t in study.trials:
        lr, wd, warmup = t.params["lr"], t.params["weight_decay"], t.params["warmup"]
        reported = sorted(t.intermediate_values.items())
        curves.append(Curve(
            run=f"readme_s{seed}_t{t.number}",
            t_hat=np.array([step / steps for step, _ in reported]),
            loss=np.array([loss for _, loss in reported]),
            lr=np.array([max(lr * ns["lr_factor"](step, warmup), 0.0) for step, _ in reported]),
            tau=ns["step_tau"](lr, wd, steps),
        ))
    write_curves_csv(path, curves)
    best = study.best_trial
    return (f"{path}: {len(study.trials)} runs, best readme_s{seed}_t{best.number} {best.value:.4f} "
            f"(warm-up {best.params['warmup']:.3f})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("optuna", "ray", "both"), default="both")
    ap.add_argument("--seeds", type=int, default=4, help="Optuna sampler seeds (sweeps per rule)")
    ap.add_argument("--ray-seeds", type=int, default=3, help="Tune search seeds (sweeps per rule)")
    ap.add_argument("--trials", type=int, default=20, help="Optuna trials per sweep")
    ap.add_argument("--samples", type=int, default=16, help="Tune samples per sweep")
    ap.add_argument("--margin", type=float, action="append", default=[],
                    help="also the collapse rule with its knob (margin) at this value (repeatable)")
    ap.add_argument("--min-fraction", type=float, action="append", default=[],
                    help="also the collapse rule with min_fraction at this value (repeatable)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="optimizer steps between two validation losses (default: the README's EVAL_EVERY)")
    ap.add_argument("--write-curves", metavar="DIR", default=None,
                    help="instead: write the Optuna example's unpruned curves of each seed to "
                         "DIR/curves_readme[_every<N>]_s<seed>.csv (for collapse-hpo replay), then stop")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    if args.eval_every is not None and args.eval_every < 1:
        ap.error(f"--eval-every must be a positive number of optimizer steps, got {args.eval_every}")
    if args.write_curves is not None:
        out = Path(args.write_curves)
        if not out.is_dir():
            ap.error(f"--write-curves {out}: no such directory")
        every = "" if args.eval_every is None else f"_every{args.eval_every}"
        for seed in range(args.seeds):
            print(write_curves(out / f"curves_readme{every}_s{seed}.csv", seed, args.trials, args.eval_every),
                  flush=True)
        return
    knobs = [f"collapse@{m:g}" for m in args.margin]
    knobs += [f"collapse@min_fraction={f:g}" for f in args.min_fraction]
    tables = []
    if args.part in ("optuna", "both"):
        tables.append(bench("optuna", ("none", "collapse", *knobs, "sha"), args.seeds, args.trials,
                            args.eval_every))
    if args.part in ("ray", "both"):
        import ray

        logging.getLogger("ray").setLevel(logging.ERROR)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        tables.append(bench("ray", ("none", "collapse", *knobs, "asha"), args.ray_seeds, args.samples,
                            args.eval_every))
    print()
    for table in tables:
        print("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
