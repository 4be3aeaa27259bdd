"""Multi-fidelity across sizes: sweep small, confirm big (a sweep file with ``stages:``).

Stage 1 sweeps the search space at a small shape (``stages[0].width``, ``.depth``). Stage 2 takes stage 1's
``top_k`` best settings to the target shape (``model``), transferred as the parametrization prescribes:

- **LR.** The trainer's ``lr`` η is the peak LR of the hidden matrices, *after* CompleteP's width scaling
  (trainers/config.py, METHOD.md §7): hidden matrices train at η = η_base/m_N, embeddings, unembedding and
  LayerNorm at η_base = η·m_N, with m_N = width/base_width, m_L = depth/base_depth. Both stages share one
  base shape (``model.base_width``/``base_depth``; when not given, stage 1's shape), so η_base is carried as
  is and the hidden LR scales with width: **η₂ = η₁ · m_N,1/m_N,2 = η₁ · width₁/width₂** (`lr_factor`).
  Depth does not move η under CompleteP (α = 1): only Adam's ε (ε/(m_N·m_L)) and the residual branches
  (1/m_L) change, and the trainer derives those from the shape.
- **λ.** Re-derived at the target so that τ = B/(ηλD) is held: λ₂ = B/(η₂ τ₂ D₂), with D₂ the target's
  training tokens (tpp·N₂ rounded to whole steps) and τ₂ the sweep's τ, or ``optimal_tau(TPP₂)`` at the
  target's TPP when ``tau: optimal`` (`predictors.timescale.derive_decay`, through the trainer's own
  `plan`).
- **Everything else** (batch_tokens, warmup, schedule fields, seeds) is carried as is. That is a choice, not
  a law: the batch size's optimum is expected to move with D at fixed TPP (Celerity scaled B ∝ D^0.5), so a
  batch-size sweep at stage 1 need not transfer (not reproduced at CPU scale: BENCHMARKS.md §10).

Stages are stored as **two Optuna studies** in the sweep's storage, ``<name>-stage1`` and ``<name>-stage2``
(results in ``<results>/stage1`` and ``<results>/stage2``). Why two and not one study with a stage attr:
each stage is then an ordinary sweep (its own plan, retries, resume, lease, report and pruner competitors,
none of which must learn to filter by stage), and stage 2's pruner takes stage 1's study as its reference
through the existing ``study`` reference (hpo/rule/reference.py, `StudyReference`): the collapse says the
normalized curve is the same at equal TPP and τ, whatever the size. Stage 2's plan (which stage-1 setting
each draw came from, and its transferred params) is stored in stage 2's study (user attr ``stage_plan``), so
``resume`` and ``report`` never recompute it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_hpo.hpo.outputs.report import check_report_outputs, trial_rows
from collapse_hpo.hpo.replays.replay import spearman
from collapse_hpo.hpo.sweep.config import STAGE_SUFFIX, SweepConfig
from collapse_hpo.hpo.sweep.finish import finish
from collapse_hpo.hpo.sweep.preflight import check_trials, preflight
from collapse_hpo.hpo.sweep.runner import SweepLocation, _sqlite_parent, locate, open_study, run_sweep
from collapse_hpo.hpo.sweep.space import sweep_total_tokens
from collapse_hpo.hpo.sweep.stop import STOP, Interrupted, stopped_line
from collapse_hpo.hpo.sweep.trial import open_storage, train_config
from collapse_hpo.hpo.sweep.urls import resolve_url
from collapse_hpo.predictors import spreadsheet
from collapse_hpo.predictors.atomic import check_writable_file, describe_os_error
from collapse_hpo.predictors.errors import InputError

if TYPE_CHECKING:
    import optuna

#: Study user attr of stage 2: its plan, one dict per draw (`top_settings` with the transferred params).
STAGE_PLAN_ATTR = "stage_plan"
#: Trial user attr of a stage-2 trial: the stage-1 draw its setting came from.
STAGE1_DRAW_ATTR = "stage1_draw"
TRANSFER_COLUMNS = ("stage1_draw", "stage2_draw", "stage1_score", "lr_1", "lr_2", "weight_decay_1",
                    "weight_decay_2", "tau_1", "tau_2", "tpp_1", "tpp_2", "final_loss_1", "final_loss_2")


# ---------------------------------------------------------------------------------------------- shapes
def base_shape(sweep: SweepConfig) -> tuple[int, int]:
    """The CompleteP base (width, depth) both stages share: the model's, else stage 1's shape."""
    first = _stages(sweep)[0]
    width = sweep.model.base_width or int(first.width or sweep.model.width)
    depth = sweep.model.base_depth or int(first.depth or sweep.model.depth)
    return width, depth


def stage_shape(sweep: SweepConfig, index: int) -> tuple[int, int]:
    """(width, depth) of stage ``index`` (0 or 1); stage 2 is the target ``model``."""
    st = _stages(sweep)[index]
    return int(st.width or sweep.model.width), int(st.depth or sweep.model.depth)


def lr_factor(sweep: SweepConfig) -> float:
    """η₂/η₁ of the hidden-matrix peak LR from stage 1 to stage 2: m_N,1/m_N,2 = width₁/width₂ (the base LR
    η·m_N is carried as is; depth does not move η under CompleteP, α = 1)."""
    base_w, _ = base_shape(sweep)
    m1 = stage_shape(sweep, 0)[0] / base_w
    m2 = stage_shape(sweep, 1)[0] / base_w
    return m1 / m2


def transfer_params(sweep: SweepConfig, params: dict[str, Any]) -> dict[str, Any]:
    """Stage-1 sampled ``params`` → stage-2 params: ``lr`` times `lr_factor`, the rest as is (λ is not a
    param: the trial derives it from τ at the target, `transfer`)."""
    out = dict(params)
    if "lr" in out:
        out["lr"] = float(out["lr"]) * lr_factor(sweep)
    return out


def _stages(sweep: SweepConfig) -> list[Any]:
    if not sweep.stages:
        raise InputError(f"{sweep.source}: field 'stages': this sweep has no stages")
    return list(sweep.stages)


def stage_names(base: str) -> list[str]:
    """Study names of the two stages of the sweep whose study name would be ``base``."""
    return [f"{base}{STAGE_SUFFIX}{i}" for i in (1, 2)]


def stage_sweep(sweep: SweepConfig, index: int, *, reference: SweepLocation | None = None,
                n_settings: int | None = None) -> SweepConfig:
    """The ordinary sweep (no ``stages``) that stage ``index`` (0 or 1) runs.

    Stage 1: the file with the small shape, the shared base shape and the stage's budget; its pruner keeps at
    least ``top_k`` trials (``keep_top_k`` raised to ``top_k``), so the settings stage 2 takes are trained to
    the end where they lead. Stage 2: the target shape; the LR (space bounds or fixed value) transferred
    (`lr_factor`); ``n_settings`` draws (default ``top_k``) planned by stage 1, so the sampler is ``random``
    and unused; its pruner's reference is stage 1's study (``reference``: stage 1's location).
    """
    stages = _stages(sweep)
    st = stages[index]
    d = sweep.to_jsonable()
    source = d.pop("source")
    d.pop("stages")
    width, depth = stage_shape(sweep, index)
    base_w, base_d = base_shape(sweep)
    d["model"] = {**d["model"], "width": width, "depth": depth, "base_width": base_w, "base_depth": base_d}
    if st.tpp is not None:
        d["tpp"], d["total_tokens"] = st.tpp, None
    elif st.total_tokens is not None:
        d["tpp"], d["total_tokens"] = None, st.total_tokens
    d["name"] = f"{sweep.name}{STAGE_SUFFIX}{index + 1}"
    top_k = int(stages[1].top_k or 1)
    pruner = dict(d["pruner"])
    if index == 0:
        pruner["keep_top_k"] = max(int(pruner["keep_top_k"]), top_k)
    else:
        factor = lr_factor(sweep)
        if "lr" in d["fixed"]:
            d["fixed"] = {**d["fixed"], "lr": float(d["fixed"]["lr"]) * factor}
        if "lr" in d["space"]:
            d["space"] = {**d["space"], "lr": _scaled(d["space"]["lr"], factor)}
        d["trials"] = int(n_settings if n_settings is not None else top_k)
        d["sampler"] = {"name": "random", "seed": sweep.sampler.seed}
        if reference is not None:
            pruner["reference"] = {"study": reference.study_name, "storage": reference.storage_url}
    d["pruner"] = pruner
    return SweepConfig.model_validate({**d, "source": source})


def _scaled(dist: dict[str, Any], factor: float) -> dict[str, Any]:
    """An LR distribution (YAML dict) with its values multiplied by ``factor``."""
    out = dict(dist)
    for key in ("low", "high", "step"):
        if out.get(key) is not None:
            out[key] = float(out[key]) * factor
    if out.get("choices") is not None:
        out["choices"] = [float(c) * factor for c in out["choices"]]
    return out


def stage_locations(sweep: SweepConfig, results: str | os.PathLike[str] | None = None, *,
                    no_prune: bool = False) -> list[SweepLocation]:
    """Where each stage lives: one storage (the sweep's), studies ``<study>-stage1/2`` (``<study>`` as
    `runner.locate` names the sweep, ``-noprune`` included), results in ``<results>/stage1``, ``/stage2``."""
    root = locate(sweep, results, no_prune=no_prune)
    names = stage_names(root.study_name)
    return [SweepLocation(root.results / f"stage{i + 1}", root.storage_url, names[i], root.prune)
            for i in range(2)]


# ---------------------------------------------------------------------------------------------- stage 1 → 2
def draw_scores(study: optuna.Study) -> dict[int, dict[str, Any]]:
    """Per draw of ``study``: its params, ``score`` (mean over seeds of the final loss, or of the predicted
    final loss of a pruned trial), ``final_loss`` (mean over seeds when every seed was trained to the end,
    else None: a mean over other seeds than another draw's would compare seed noise) and how many seeds were
    trained to the end. FAILed trials are left out; a draw with none left is absent."""
    import optuna

    TS = optuna.trial.TrialState
    by_draw: dict[int, dict[str, Any]] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda tr: tr.number):
        if t.state not in (TS.COMPLETE, TS.PRUNED):
            continue
        draw = int(t.user_attrs.get("draw", t.number))
        entry = by_draw.setdefault(draw, {"params": dict(t.params), "scores": [], "finals": [], "n": 0})
        entry["n"] += 1
        if t.state == TS.COMPLETE and t.value is not None and math.isfinite(t.value):
            entry["scores"].append(float(t.value))
            entry["finals"].append(float(t.value))
        else:
            pred = t.user_attrs.get("predicted_final_loss")
            if isinstance(pred, int | float) and math.isfinite(pred):
                entry["scores"].append(float(pred))
    out = {}
    for draw, e in by_draw.items():
        if not e["scores"]:
            continue
        out[draw] = {"params": e["params"], "score": sum(e["scores"]) / len(e["scores"]),
                     "final_loss": (sum(e["finals"]) / len(e["finals"])
                                    if e["finals"] and len(e["finals"]) == e["n"] else None),
                     "complete_seeds": len(e["finals"])}
    return out


def top_settings(study: optuna.Study, k: int) -> list[dict[str, Any]]:
    """Stage 1's ``k`` best draws by `draw_scores` score (lowest first; ties by draw): a list of
    ``{"stage1_draw", "stage1_score", "stage1_params"}``. Fewer when fewer draws finished."""
    scores = draw_scores(study)
    best = sorted(scores, key=lambda dr: (scores[dr]["score"], dr))[:k]
    return [{"stage1_draw": dr, "stage1_score": scores[dr]["score"], "stage1_params": scores[dr]["params"]}
            for dr in best]


def stage2_plan(sweep: SweepConfig, study1: optuna.Study) -> list[dict[str, Any]]:
    """Stage 2's plan: `top_settings` of stage 1 with ``params`` (transferred, `transfer_params`). InputError
    when stage 1 finished no setting."""
    k = int(_stages(sweep)[1].top_k or 1)
    best = top_settings(study1, k)
    if not best:
        raise InputError(f"{sweep.source}: stage 1 ({study1.study_name!r}) finished no trial (every one "
                         "failed): nothing to take to stage 2; fix the cause, then `collapse-hpo resume`")
    return [{**b, "params": transfer_params(sweep, b["stage1_params"])} for b in best]


def transfer(sweep: SweepConfig, params1: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """What the transfer does to one stage-1 setting: the trainer-derived ``lr``, ``weight_decay`` (λ),
    ``tau`` (τ), ``tpp``, ``total_tokens`` (D) and ``params_non_embedding`` (N) of stage 1 and of stage 2,
    as ``{"stage1": {...}, "stage2": {...}}`` (from `hpo.sweep.trial.train_config`: what the trials train
    with)."""
    seed = sweep.seeds[0] if seed is None else seed
    out = {}
    for i, params in ((0, params1), (1, transfer_params(sweep, params1))):
        _cfg, derived = train_config(stage_sweep(sweep, i), dict(params), seed)
        out[f"stage{i + 1}"] = {k: derived[k] for k in ("lr", "weight_decay", "tau", "tpp", "total_tokens",
                                                        "params_non_embedding", "batch_tokens")}
    return out


# ---------------------------------------------------------------------------------------------- running
def stored_plan(loc: SweepLocation, sweep: SweepConfig) -> list[dict[str, Any]] | None:
    """Stage 2's stored plan (study user attr ``stage_plan``), or None when its study does not exist."""
    import optuna

    storage = open_storage(resolve_url(loc.storage_url, f"{sweep.source}: field 'storage'"), sweep)
    try:
        study = optuna.load_study(study_name=loc.study_name, storage=storage)
    except KeyError:
        return None
    plan = study.user_attrs.get(STAGE_PLAN_ATTR)
    if not isinstance(plan, list) or not plan:
        raise InputError(f"{sweep.source}: study {loc.study_name!r} has no stage plan (attr "
                         f"{STAGE_PLAN_ATTR!r}): not made by a sweep with stages; use another --results")
    return plan


def run_stages(sweep: SweepConfig, results: str | os.PathLike[str] | None = None, *, no_prune: bool = False,
               resume: bool = False, out: Any = None) -> list[optuna.Study]:
    """Run (or ``resume``) both stages to the end; returns [stage-1 study, stage-2 study].

    ``run`` creates stage 1 (refused when it exists), runs it, ranks its settings, then creates and runs stage
    2. ``resume`` continues stage 1, then continues stage 2, or creates it when the sweep stopped before it
    began. Nothing is created when the file, the storage or the results folder is bad (`runner.run_sweep`'s
    preflight).
    """
    import sys

    locs = stage_locations(sweep, results, no_prune=no_prune)
    stream = out or sys.stdout
    if resume:
        _check_resumable(sweep, locs[0])
    first = stage_sweep(sweep, 0)
    _preflight(sweep, first, locs)
    print(f"stage 1 of 2: {_describe(sweep, 0)}", file=stream, flush=True)
    study1 = run_sweep(first, locs[0], resume=resume, out=out)
    if STOP.signum is not None:  # stopped by a signal in stage 1: stage 2 is not begun
        raise Interrupted(STOP.signum, stopped_line(STOP.signum, sweep.source))
    plan = stored_plan(locs[1], sweep) if resume else None
    resume2 = plan is not None
    if plan is None:
        plan = stage2_plan(sweep, study1)
    second = stage_sweep(sweep, 1, reference=locs[0], n_settings=len(plan))
    print(f"stage 2 of 2: {_describe(sweep, 1)}; settings from stage 1 draws "
          f"{[p['stage1_draw'] for p in plan]}, lr × {lr_factor(sweep):.4g}", file=stream, flush=True)
    study2 = run_sweep(second, locs[1], resume=resume2, out=out,
                       plan=None if resume2 else [p["params"] for p in plan],
                       attrs=None if resume2 else {STAGE_PLAN_ATTR: plan})
    return [study1, study2]


def _preflight(sweep: SweepConfig, first: SweepConfig, locs: list[SweepLocation]) -> None:
    """Before anything is created: every check of `run` for stage 1 (against the folder that holds both
    stages and the storage), and stage 2's trials at the target shape (config, tokens, memory); then the
    folder is made, so each stage's own preflight finds its storage's folder."""
    root = Path(locs[0].results).parent
    preflight(first, root, locs[0].storage_url, locs[0].prune)
    check_trials(stage_sweep(sweep, 1))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{sweep.source}: {describe_os_error(root, err)}") from None


def _check_resumable(sweep: SweepConfig, loc: SweepLocation) -> None:
    """`resume` of a sweep whose default SQLite storage does not exist: say so before anything is created."""
    parent = _sqlite_parent(loc.storage_url)
    if parent is not None and parent == loc.results.parent and not (parent / "study.db").exists():
        raise InputError(f"{sweep.source}: no sweep to resume in {parent}: start it with "
                         f"`collapse-hpo run {sweep.source}`")


def _describe(sweep: SweepConfig, index: int) -> str:
    width, depth = stage_shape(sweep, index)
    st = stage_sweep(sweep, index)

    _d, tpp, n = sweep_total_tokens(st)
    what = f"{st.n_draws} settings" if index == 0 else f"top {_stages(sweep)[1].top_k} settings"
    return f"width {width}, depth {depth} ({n / 1e3:.1f}K non-embedding params, {tpp:.3g} TPP), {what}"


# ---------------------------------------------------------------------------------------------- report
def trial_compute(study: optuna.Study) -> float:
    """Compute of every trial of ``study`` (failed attempts included) in N·D: Σ tokens trained × non-embedding
    params (6·N·D is the usual FLOPs estimate)."""
    total = 0.0
    params = {t.number: t.user_attrs.get("params_non_embedding") for t in study.get_trials(deepcopy=False)}
    for r in trial_rows(study):
        n = params.get(r["number"])
        if isinstance(n, int | float) and r["tokens_trained"]:
            total += float(r["tokens_trained"]) * float(n)
    return total


def full_sweep_compute(sweep: SweepConfig, study1: optuna.Study) -> float:
    """N·D of a full sweep of stage 1's settings at the target shape, every trial to the end (each seed)."""
    total = 0.0
    seen = set()
    for t in study1.get_trials(deepcopy=False):
        draw = int(t.user_attrs.get("draw", t.number))
        if draw in seen or not t.params:
            continue
        seen.add(draw)
        tr = transfer(sweep, dict(t.params))["stage2"]
        total += float(tr["total_tokens"]) * float(tr["params_non_embedding"]) * len(sweep.seeds)
    missing = max(0, stage_sweep(sweep, 0).n_draws - len(seen))
    if missing and seen:
        total += missing * total / len(seen)
    return total


def transfer_rows(sweep: SweepConfig, study1: optuna.Study, study2: optuna.Study) -> list[dict[str, Any]]:
    """One row per stage-2 setting (keys `TRANSFER_COLUMNS`): where it came from, lr/λ/τ/TPP at each stage
    (as the trials train them) and the final loss at each stage (mean over seeds trained to the end)."""
    plan = study2.user_attrs.get(STAGE_PLAN_ATTR) or []
    s1, s2 = draw_scores(study1), draw_scores(study2)
    rows = []
    for draw2, p in enumerate(plan):
        draw1 = int(p["stage1_draw"])
        tr = transfer(sweep, dict(p["stage1_params"]))
        a, b = tr["stage1"], tr["stage2"]
        rows.append({
            "stage1_draw": draw1, "stage2_draw": draw2, "stage1_score": p.get("stage1_score"),
            "lr_1": a["lr"], "lr_2": b["lr"], "weight_decay_1": a["weight_decay"],
            "weight_decay_2": b["weight_decay"], "tau_1": a["tau"], "tau_2": b["tau"], "tpp_1": a["tpp"],
            "tpp_2": b["tpp"], "final_loss_1": (s1.get(draw1) or {}).get("final_loss"),
            "final_loss_2": (s2.get(draw2) or {}).get("final_loss"),
        })
    return rows


def rank_agreement(rows: list[dict[str, Any]]) -> tuple[float, int]:
    """Spearman ρ of the stage-1 and stage-2 final losses of the settings both stages trained to the end, and
    how many there were (ρ is NaN below 3)."""
    pairs = [(r["final_loss_1"], r["final_loss_2"]) for r in rows
             if r["final_loss_1"] is not None and r["final_loss_2"] is not None]
    return spearman([p[0] for p in pairs], [p[1] for p in pairs]), len(pairs)


def _g(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def stages_summary(sweep: SweepConfig, study1: optuna.Study, study2: optuna.Study) -> list[str]:
    """The lines `report` prints after both stages' tables: the transfer table, the rank agreement, the
    stage-2 winner and the compute of both stages against a full sweep at the target shape."""
    rows = transfer_rows(sweep, study1, study2)
    w1, w2 = stage_shape(sweep, 0)[0], stage_shape(sweep, 1)[0]
    lines = [f"transfer: stage 1 (width {w1}) → stage 2 (width {w2}): lr × {lr_factor(sweep):.4g} "
             f"(CompleteP: hidden LR ∝ 1/m_N, base width {base_shape(sweep)[0]}); λ re-derived to hold τ at "
             "stage 2's TPP"]
    head = ["stage-1 draw", "stage-2 draw", "lr", "λ", "τ", "TPP", "loss 1", "loss 2"]
    def pair(r: dict[str, Any], key: str) -> str:
        return f"{_g(r[key + '_1'])} → {_g(r[key + '_2'])}"

    table = [[str(r["stage1_draw"]), str(r["stage2_draw"]), pair(r, "lr"), pair(r, "weight_decay"),
              pair(r, "tau"), pair(r, "tpp"), _g(r["final_loss_1"], ".4f"), _g(r["final_loss_2"], ".4f")]
             for r in rows]
    widths = [max(len(h), *(len(x[i]) for x in table)) if table else len(h) for i, h in enumerate(head)]
    lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in table]
    rho, n = rank_agreement(rows)
    if n >= 3:
        lines.append(f"rank agreement: Spearman ρ = {rho:.2f} between stage-1 and stage-2 final losses of "
                     f"the {n} settings both stages trained to the end")
    else:
        lines.append(f"rank agreement: Spearman ρ needs 3 settings trained to the end (every seed) in both "
                     f"stages; {n} were")
    done = [r for r in rows if r["final_loss_2"] is not None]
    if done:
        win = min(done, key=lambda r: r["final_loss_2"])
        lines.append(f"stage-2 winner: stage-1 draw {win['stage1_draw']} (stage-2 draw {win['stage2_draw']}) "
                     f"lr={win['lr_2']:.4g} λ={_g(win['weight_decay_2'], '.4g')} "
                     f"final_loss={win['final_loss_2']:.4f}")
    c1, c2 = trial_compute(study1), trial_compute(study2)
    full = full_sweep_compute(sweep, study1)
    frac = (c1 + c2) / full if full > 0 else math.nan
    lines.append(f"compute (N·D, non-embedding params × tokens): stage 1 {c1:.3g} + stage 2 {c2:.3g} = "
                 f"{100 * frac:.1f}% of a full sweep of stage 1's {stage_sweep(sweep, 0).n_draws} settings "
                 f"at width {w2} ({full:.3g})")
    return lines


def write_transfer_csv(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """The transfer rows as CSV (columns `TRANSFER_COLUMNS`), atomically."""
    spreadsheet.write_csv(
        path, TRANSFER_COLUMNS, ({k: ("" if r[k] is None else r[k]) for k in TRANSFER_COLUMNS} for r in rows)
    )


def finish_stages(sweep: SweepConfig, locs: list[SweepLocation], studies: list[optuna.Study | None]) -> int:
    """Report each stage (its table, files and dashboard, as a plain sweep), then the stages summary; write
    ``transfer.csv`` next to the stage folders. Returns 1 when a stage's every trial failed, else 0."""
    for loc, study in zip(locs, studies):  # every output of every stage checked before any is written
        if study is not None and Path(loc.results).is_dir():
            check_report_outputs(loc.results)
    if studies[1] is not None and studies[0] is not None:
        check_writable_file(Path(locs[1].results).parent / "transfer.csv", "transfer table")
    status = 0
    for i, (loc, study) in enumerate(zip(locs, studies)):
        if study is None:
            print(f"stage {i + 1} of 2: not started yet (continue with `collapse-hpo resume {sweep.source}`)")
            continue
        print(f"== stage {i + 1} of 2: {_describe(sweep, i)} (study {loc.study_name!r})")
        staged = stage_sweep(sweep, i, reference=locs[0] if i else None,
                             n_settings=_n_settings(study) if i else None)
        status = max(status, finish(study, staged, loc))
    if studies[1] is not None and studies[0] is not None:
        print("== stages")
        for line in stages_summary(sweep, studies[0], studies[1]):
            print(line)
        path = Path(locs[1].results).parent / "transfer.csv"
        write_transfer_csv(path, transfer_rows(sweep, studies[0], studies[1]))
        print(f"files: {path}")
    return status


def _n_settings(study: optuna.Study) -> int | None:
    plan = study.user_attrs.get(STAGE_PLAN_ATTR)
    return len(plan) if isinstance(plan, list) and plan else None


def open_stages(sweep: SweepConfig, locs: list[SweepLocation]) -> list[optuna.Study | None]:
    """The stage studies that exist (`report`): stage 1 must; stage 2 is None before it began."""
    study1 = open_study(stage_sweep(sweep, 0), locs[0])
    plan = stored_plan(locs[1], sweep)
    if plan is None:
        return [study1, None]
    second = stage_sweep(sweep, 1, reference=locs[0], n_settings=len(plan))
    return [study1, open_study(second, locs[1])]
