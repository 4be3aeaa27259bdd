"""Training plans of the evidence benchmark (studies/bench/evidence.py): which runs; a cached parallel runner.

Every run is one `TrainConfig` on the trainer (trainers/train.py). A run's curve is cached as a one-run
curve CSV (`predictors.curves.write_curves_csv`) plus a JSON of its settings under
``<cache>/<name>.csv|json``; a cached run is never retrained (delete the file to redo it). Runs are trained
by a multiprocessing pool (``workers`` processes, 1 torch thread each), in plan order: the plan lists the
most important runs first, so a run cut short by a deadline still leaves the first families complete.

Families (names are the artefact files):
- ``lr_tau``: LR varied, τ held at τ_opt(20) (λ = B/(η τ D) per trial); ``lr_lambda``: LR varied, λ fixed at
  the value that gives τ_opt at the middle LR. ``bs_tau`` / ``bs_lambda``: the same with the batch size
  varied.
- ``collapse_tau``: sizes at 20 TPP, τ = τ_opt(20), CompleteP LR η = base_lr / m_N, fixed B;
  ``collapse_lambda``: the same shapes with λ fixed at the smallest size's value (τ falls as 1/m_N).
- ``alarm_clean`` / ``alarm_fault`` / ``alarm_medium`` / ``alarm_weak``: small runs at τ_opt with several
  seeds; the faulty ones switch on the trainer's ``loss_normalization`` fault at t̂ = 0.4 (strength 1,
  MEDIUM_FAULT_STRENGTH and WEAK_FAULT_STRENGTH). The medium family is planned last (added after the
  others were trained), so a cache of the others stays valid.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collapse_hpo.predictors.curves import Curve, read_curves_csv, write_curves_csv
from collapse_hpo.predictors.timescale import optimal_tau, weight_decay_for_tau

TPP = 20.0
TAU_OPT = optimal_tau(TPP)


@dataclass
class RunSpec:
    """One training run: its family, name and the TrainConfig keywords (plus an optional fault)."""

    family: str
    name: str
    config: dict[str, Any]
    fault: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Size:
    """Budget of one benchmark size (see ``plan``)."""

    sweep_width: int
    lr_trials: int
    bs_trials: int
    sweep_seeds: tuple[int, ...]
    collapse_widths: tuple[int, ...]
    collapse_seeds: tuple[int, ...]
    alarm_width: tuple[int, ...]
    alarm_clean: int
    alarm_fault: int
    depth: int = 2
    base_width: int = 32
    batch_tokens: int = 2048
    context: int = 128


SIZES: dict[str, Size] = {
    # The brief's sizes: ~99K non-embedding parameters for the sweeps (2.0M tokens each at 20 TPP), the
    # collapse family 25K, 99K, 222K, 394K (widths 32, 64, 96, 128), alarm runs at 25K (width 32).
    "full": Size(
        sweep_width=64,
        lr_trials=16,
        bs_trials=8,
        sweep_seeds=(0, 1),
        collapse_widths=(32, 64, 96, 128),
        collapse_seeds=(10, 11),
        alarm_width=(32,),
        alarm_clean=30,
        alarm_fault=15,
    ),
    # Tiny models (a few thousand parameters, ~60K tokens a run): minutes on 2 cores; what the tests run.
    "small": Size(
        sweep_width=16,
        lr_trials=5,
        bs_trials=0,
        sweep_seeds=(0,),
        collapse_widths=(12, 16, 24),
        collapse_seeds=(10,),
        alarm_width=(12, 16),
        alarm_clean=3,
        alarm_fault=2,
        depth=1,
        base_width=16,
        batch_tokens=1024,
        context=64,
    ),
}

# Hidden-matrix peak LRs at the base width (Size.base_width); a model of width w gets them × base_width / w
# (CompleteP), so the sweeps at every width cover the same range around the transferred optimum.
LR_RANGE = (2e-3, 1.2e-1)
LR_CENTER = 1.5e-2
BS_RANGE = (512, 8192)
WEAK_FAULT_STRENGTH = 0.2  # fault.strength of the weak-fault runs (the strong ones: the default 1.0)
MEDIUM_FAULT_STRENGTH = 0.5  # fault.strength of the medium-fault runs (alarm_medium, full size only)


def _shape(width: int, depth: int) -> dict[str, int]:
    return {"width": width, "depth": depth, "heads": max(1, width // 16)}


def _total_tokens(width: int, depth: int, batch: int) -> int:
    from collapse_hpo.trainers.config import count_parameters

    n, _ = count_parameters(width, depth, max(1, width // 16))
    return max(1, round(TPP * n / batch)) * batch


def _base(size: Size, **kw: Any) -> dict[str, Any]:
    d = {
        "depth": size.depth,
        "base_width": size.base_width,
        "base_depth": size.depth,
        "context": size.context,
        "tpp": TPP,
        "batch_tokens": size.batch_tokens,
        "threads": 1,
        "val_fractions": (),
    }
    d.update(kw)
    return d


def plan(size_name: str) -> list[RunSpec]:
    """Every run of a benchmark size, most important first."""
    size = SIZES[size_name]
    w0, depth = size.sweep_width, size.depth
    runs: list[RunSpec] = []

    m_n = w0 / size.base_width  # the sweep model's width multiplier
    lrs = np.geomspace(*LR_RANGE, size.lr_trials) / m_n if size.lr_trials else []
    lr_center = LR_CENTER / m_n
    d0 = _total_tokens(w0, depth, size.batch_tokens)
    lam_fixed = weight_decay_for_tau(size.batch_tokens, lr_center, TAU_OPT, d0)
    bss = (
        sorted({int(128 * round(b / 128)) for b in np.geomspace(*BS_RANGE, size.bs_trials)})
        if size.bs_trials
        else []
    )

    def lr_sweeps(seed: int) -> list[RunSpec]:
        out = []
        for i, lr in enumerate(lrs):
            cfg = _base(size, **_shape(w0, depth), lr=float(lr), seed=seed)
            out.append(
                RunSpec(
                    "lr_tau",
                    f"lr_tau_s{seed}_{i:02d}",
                    {**cfg, "tau": TAU_OPT},
                    meta={"lr": float(lr), "seed": seed},
                )
            )
            out.append(
                RunSpec(
                    "lr_lambda",
                    f"lr_lambda_s{seed}_{i:02d}",
                    {**cfg, "weight_decay": lam_fixed},
                    meta={"lr": float(lr), "seed": seed},
                )
            )
        return out

    def bs_sweeps(seed: int) -> list[RunSpec]:
        out = []
        for i, b in enumerate(bss):
            cfg = _base(size, **_shape(w0, depth), lr=lr_center, batch_tokens=b, seed=seed)
            out.append(
                RunSpec(
                    "bs_tau",
                    f"bs_tau_s{seed}_{i:02d}",
                    {**cfg, "tau": TAU_OPT},
                    meta={"batch_tokens": b, "seed": seed},
                )
            )
            out.append(
                RunSpec(
                    "bs_lambda",
                    f"bs_lambda_s{seed}_{i:02d}",
                    {**cfg, "weight_decay": lam_fixed},
                    meta={"batch_tokens": b, "seed": seed},
                )
            )
        return out

    def collapse(seed: int) -> list[RunSpec]:
        out = []
        wmin = min(size.collapse_widths)
        dmin = _total_tokens(wmin, depth, size.batch_tokens)
        lr_min = LR_CENTER * size.base_width / wmin
        lam = weight_decay_for_tau(size.batch_tokens, lr_min, TAU_OPT, dmin)
        for w in sorted(size.collapse_widths, reverse=True):  # longest first: keeps both workers busy
            lr = LR_CENTER * size.base_width / w  # CompleteP: hidden LR = base LR / m_N
            cfg = _base(size, **_shape(w, depth), lr=lr, seed=seed)
            out.append(
                RunSpec(
                    "collapse_tau",
                    f"collapse_tau_w{w}_s{seed}",
                    {**cfg, "tau": TAU_OPT},
                    meta={"width": w, "seed": seed},
                )
            )
            if w != wmin:  # at the smallest width the λ-fixed run is the τ-optimal one
                out.append(
                    RunSpec(
                        "collapse_lambda",
                        f"collapse_lambda_w{w}_s{seed}",
                        {**cfg, "weight_decay": lam},
                        meta={"width": w, "seed": seed},
                    )
                )
        return out

    def alarm_runs(family: str, seed0: int, n: int, fault: dict[str, Any] | None) -> list[RunSpec]:
        """``n`` runs at τ_opt, widths cycled, seeds seed0…; ``fault`` None: clean, else the
        ``loss_normalization`` fault at t̂ = 0.4 with these extra settings (e.g. its strength)."""
        out = []
        for k in range(n):
            w, seed = size.alarm_width[k % len(size.alarm_width)], seed0 + k
            cfg = _base(size, **_shape(w, depth), lr=LR_CENTER * size.base_width / w, seed=seed, tau=TAU_OPT)
            meta: dict[str, Any] = {"width": w, "seed": seed}
            spec = None
            if fault is not None:
                spec = {"kind": "loss_normalization", "start_t_hat": 0.4,
                        "micro_batch_tokens": size.batch_tokens // 2, **fault}
                meta["fault_t_hat"] = 0.4
            out.append(RunSpec(family, f"{family}_w{w}_s{seed}", cfg, fault=spec, meta=meta))
        return out

    def alarm() -> list[RunSpec]:
        # strength 1 (the default), clean runs, and the same fault weaker: a slow drift (the paper's 1.8B run)
        return (
            alarm_runs("alarm_fault", 200, size.alarm_fault, {})
            + alarm_runs("alarm_clean", 100, size.alarm_clean, None)
            + alarm_runs("alarm_weak", 300, size.alarm_fault, {"strength": WEAK_FAULT_STRENGTH})
        )

    seeds = list(size.sweep_seeds)
    cseeds = list(size.collapse_seeds)

    if seeds:
        runs += lr_sweeps(seeds[0])
    if cseeds:
        runs += collapse(cseeds[0])
    runs += alarm()
    if seeds:
        runs += bs_sweeps(seeds[0])
    for s in cseeds[1:]:
        runs += collapse(s)
    for s in seeds[1:]:
        runs += lr_sweeps(s)
    for s in seeds[1:]:
        runs += bs_sweeps(s)
    n_medium = size.alarm_fault if size_name == "full" else 0
    runs += alarm_runs("alarm_medium", 400, n_medium, {"strength": MEDIUM_FAULT_STRENGTH})
    return runs


def _train_one(args: tuple[RunSpec, str]) -> tuple[str, float, str | None]:
    """Worker: train one run and write its cache files atomically. Returns (name, seconds, error)."""
    spec, cache = args
    t0 = time.perf_counter()
    try:
        import torch

        torch.set_num_threads(1)
        from collapse_hpo.trainers.config import FAULT_ACKNOWLEDGEMENT, FaultConfig, TrainConfig
        from collapse_hpo.trainers.train import train

        cfg = dict(spec.config)
        if spec.fault is not None:
            cfg["fault"] = FaultConfig(acknowledge=FAULT_ACKNOWLEDGEMENT, **spec.fault)
        result = train(TrainConfig(**cfg))
        curve = result.to_curve(spec.name)
        md = {k: v for k, v in result.metadata.items() if k not in ("config",)}
        path = Path(cache) / f"{spec.name}.csv"
        write_curves_csv(path, [curve])
        info = {
            "family": spec.family,
            "name": spec.name,
            "config": spec.config,
            "fault": spec.fault,
            "meta": spec.meta,
            "metadata": md,
        }
        tmp = Path(cache) / f".{spec.name}.json.tmp"
        tmp.write_text(json.dumps(info, default=str, indent=1))
        os.replace(tmp, Path(cache) / f"{spec.name}.json")
        return spec.name, time.perf_counter() - t0, None
    except Exception as err:  # one failed run must not stop the others; it is reported
        return spec.name, time.perf_counter() - t0, f"{type(err).__name__}: {err}"


def run_plan(
    runs: list[RunSpec],
    cache: str | os.PathLike[str],
    *,
    workers: int = 2,
    deadline: float | None = None,
    log=print,
) -> list[str]:
    """Train the runs not in ``cache`` yet (in order, ``workers`` processes); return the names that failed.

    ``deadline`` (a time.time() value): no new run starts after it.
    """
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    todo = [r for r in runs if not (cache / f"{r.name}.json").exists()]
    log(
        f"training: {len(runs) - len(todo)} of {len(runs)} runs cached, {len(todo)} to train "
        f"on {workers} workers"
    )
    failed: list[str] = []
    if not todo:
        return failed
    ctx = mp.get_context("spawn")
    t0 = time.time()
    with ctx.Pool(workers, maxtasksperchild=8) as pool:
        pending = [pool.apply_async(_train_one, ((r, str(cache)),)) for r in todo]
        for done, job in enumerate(pending, start=1):
            if deadline is not None and time.time() > deadline and not job.ready():
                log(f"training: deadline reached, {len(todo) - done + 1} runs left untrained")
                pool.terminate()
                break
            try:
                remaining = None if deadline is None else max(1.0, deadline - time.time() + 3600)
                name, secs, err = job.get(timeout=remaining)
            except mp.TimeoutError:
                log("training: deadline reached while waiting")
                pool.terminate()
                break
            if err:
                failed.append(name)
                log(f"  [{done}/{len(todo)}] {name}: FAILED {err}")
            else:
                log(f"  [{done}/{len(todo)}] {name}: {secs:.0f} s (elapsed {time.time() - t0:.0f} s)")
    return failed


def load_family(cache: str | os.PathLike[str], family: str) -> list[Curve]:
    """Curves of a family from the cache (run order), with each run's settings in ``curve.meta``."""
    cache = Path(cache)
    out = []
    for js in sorted(cache.glob(f"{family}_*.json")):
        info = json.loads(js.read_text())
        if info["family"] != family:
            continue
        (curve,) = read_curves_csv(cache / f"{info['name']}.csv")
        curve.meta = {
            **info["meta"],
            "params_non_embedding": info["metadata"].get("params_non_embedding"),
            "total_tokens": info["metadata"].get("total_tokens"),
            "weight_decay": info["metadata"].get("weight_decay"),
            "batch_tokens": info["metadata"].get("batch_tokens"),
            "fault": info["fault"],
            "tokens_per_second": info["metadata"].get("tokens_per_second"),
        }
        out.append(curve)
    return out


if __name__ == "__main__":  # train a size's runs into a cache: python evidence_train.py SIZE CACHE [WORKERS]
    size_name, cache_dir = sys.argv[1], sys.argv[2]
    n_workers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    bad = run_plan(plan(size_name), cache_dir, workers=n_workers, log=lambda s: print(s, flush=True))
    print(f"failed: {bad}" if bad else "all runs trained", flush=True)
    sys.exit(1 if bad else 0)
