"""Replay finished loss curves through early-stopping rules as a live sweep would have fed them.

A sweep is a set of complete curves (one per trial) on a common grid of report points in t̂ (fraction of the
trial's training tokens). A replay picks a random trial order and runs the sweep with ``workers`` concurrent
workers: every worker trains one trial at a time, reports each grid point to the pruner in turn (all report
points take the same wall time, as when every trial has the same token budget), and takes the next trial
in the
order when its trial ends, completed or pruned. The pruner sees exactly what a live sweep's pruner would: the
partial curves of running trials and the complete curves of finished ones.

Measured per replay (``ReplayResult``):

- compute: tokens trained / tokens of the unpruned sweep (trial weights default to 1: equal token budgets);
- regret: best final loss among the trials that ran to the end, minus the best final loss of all trials (the
  final loss is the curve's last loss, the same number a sweep without pruning would rank by);
- best_pruned: whether the trial with the best final loss was stopped;
- decision fractions: the t̂ at which each pruned trial was stopped;
- late compute: tokens spent on trials pruned after t̂ ``LATE_FRACTION`` (0.3) / tokens of the unpruned sweep:
  what a rule spends by deciding late (a trial cut at t̂ 0.8 cost 0.8 of a trial to learn it was not needed).

Pruners plug in through the ``ReplayPruner`` protocol (adapters for Optuna pruners, Ray Tune schedulers
and the
other peers live in ``collapse_hpo.hpo.replays.peers``). This module needs numpy only (matplotlib for the
plot).

Speed (``replay``): what does not depend on the trial order is computed once per pruner and shared by its
orders (``ReplayCaches``: every final-loss prediction, keyed by its inputs, and every online reference fit,
keyed by the curves fitted); ``jobs`` spreads the (pruner, order) replays over worker processes. Both are
exact: the decisions are those of the plain path (tests/test_replay_cache.py). The online reference is
refitted where the live pruner refits it (it is the live pruner): when the count of completed trials has
reached the next point of its refit schedule (3, 4, 6, 9, 13, ...: hpo/rule/reference.py ``REFIT_GROWTH``;
with its prior serving, from 13 on: fewer trials make a thin fit) at a judgement. The trials fitted differ
from order to order, so its fits are rarely shared.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from collapse_hpo.hpo.figures import pyplot, save_png
from collapse_hpo.hpo.rule.reference import FitCache, fit_caching
from collapse_hpo.predictors import spreadsheet
from collapse_hpo.predictors.curves import Curve, some_runs
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.predict import PredictionCache, caching

#: Optuna and Ray want integer progress: report steps are t̂ in units of 1/STEP_SCALE of training.
STEP_SCALE = 1000
#: A prune after this t̂ is a late one: ``ReplayResult.late_compute`` counts the tokens such trials trained
#: (issue 20, item 4: "the compute spent on trials pruned after t̂ 0.3").
LATE_FRACTION = 0.3


@dataclass
class Sweep:
    """Complete curves of one sweep on a common report grid.

    Attributes:
        curves: the trials' curves (schedule, tau, tpp are what a pruner may know of each trial).
        grid: report points t̂ (fraction of each trial's tokens), ascending, last one 1.0 (or the common end).
        losses: array [n_trials, n_reports] of the loss at each report point (interpolated on the curve).
        finals: final loss of each trial (its curve's last finite loss).
        weights: tokens of each trial relative to the others (1 for equal token budgets).
        name: a label for tables.
        merged: report points left out because they lay closer than 1/STEP_SCALE of training to the point
            kept before them (per-step logs: the replay's pruners count progress in 1/STEP_SCALE-ths).
    """

    curves: list[Curve]
    grid: np.ndarray
    losses: np.ndarray
    finals: np.ndarray
    weights: np.ndarray
    name: str = "sweep"
    merged: int = 0

    @property
    def n_trials(self) -> int:
        """Number of trials in the sweep."""
        return len(self.curves)

    @property
    def steps(self) -> np.ndarray:
        """Integer report steps (t̂ · STEP_SCALE, rounded) for pruners that need integer progress."""
        return np.rint(self.grid * STEP_SCALE).astype(int)

    @property
    def best(self) -> int:
        """Index of the trial with the lowest final loss."""
        return int(np.argmin(self.finals))


def make_sweep(
    curves: Sequence[Curve],
    *,
    n_reports: int | None = None,
    weights: Sequence[float] | None = None,
    name: str = "sweep",
    source: str = "curves",
) -> Sweep:
    """Put complete curves on a common report grid.

    If every curve has the same observed t̂ points, those are the grid (what the trainer reported).
    Otherwise the grid is ``n_reports`` evenly spaced points (default: the median point count, capped at 200)
    from the latest first point to the earliest last point, and each curve's loss is linearly interpolated
    onto it. Points closer than 1/STEP_SCALE of training to the point kept before them are left out (the
    last point is always kept; ``Sweep.merged`` counts them): a per-step log is replayed at the finest
    progress Optuna's and Ray's integer steps can tell apart, on the points it reported.

    A curve that diverged (``Curve.diverged_at``: a NaN/inf loss in its file) has an infinite loss on the
    grid from there on and an infinite final loss: `simulate` stops it at its first such report
    (pruned by divergence), as a live sweep does.

    Raises InputError (naming ``source`` and the run) for fewer than 2 curves, duplicate run names, or a curve
    with fewer than 3 finite points or one that does not reach t̂ ≥ 0.99 (unless it diverged).
    """
    curves = list(curves)
    if len(curves) < 2:
        raise InputError(f"{source}: a sweep needs at least 2 runs, got {len(curves)}; add runs to the file")
    names = [c.run for c in curves]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InputError(f"{source}: run names must be unique, repeated: {sorted(dup)[0]!r}")
    pts: list[tuple[np.ndarray, np.ndarray]] = []
    short: list[str] = []  # runs that stop before t̂ 0.99 (not diverged): named together below
    for c in curves:
        ok = np.isfinite(c.loss) & np.isfinite(c.t_hat)
        t, y = c.t_hat[ok], c.loss[ok]
        if t.size < 3 and c.diverged_at is None:
            raise InputError(f"{source}: run {c.run!r} has {t.size} finite loss points; it needs at least 3")
        if c.diverged_at is not None:  # on the grid: the last finite loss until divergence, inf from there
            t = np.append(t, [c.diverged_at, 1.0]) if t.size else np.array([0.0, c.diverged_at, 1.0])
            y = np.append(y, [math.inf, math.inf]) if y.size else np.array([math.inf] * 3)
            keep = np.concatenate([[True], np.diff(t) > 0])
            t, y = t[keep], y[keep]
        if t[-1] < 0.99:
            short.append(f"{c.run!r} (ends at t_hat={t[-1]:.3g})")
        pts.append((t, y))
    if short:
        raise InputError(
            f"{source}: {len(short)} of {len(curves)} runs stop before the end: {some_runs(short)}; replay "
            "needs complete curves (t_hat >= 0.99), since a run stopped early has no final loss to rank it "
            "by: remove those runs' rows (a diverged run, its loss NaN or inf from some point, is kept)"
        )
    same = all(p[0].shape == pts[0][0].shape and np.allclose(p[0], pts[0][0], atol=1e-9) for p in pts)
    if same and (n_reports is None or n_reports == pts[0][0].size):
        grid = pts[0][0].copy()
        losses = np.stack([p[1] for p in pts])
    else:
        n = n_reports or int(min(200, np.median([p[0].size for p in pts])))
        lo = max(p[0][0] for p in pts)
        hi = min(p[0][-1] for p in pts)
        grid = np.linspace(lo, hi, max(n, 3))
        losses = np.stack([_interp(grid, t, y) for t, y in pts])
    keep = distinct_steps(grid)
    if keep.size < 2 or np.any(np.diff(np.rint(grid[keep] * STEP_SCALE)) <= 0):
        raise InputError(f"{source}: the report grid spans less than 1/{STEP_SCALE} of training; the curves "
                         "must share reports from early in training to t_hat >= 0.99")
    finals = np.array([p[1][-1] for p in pts])
    w = np.ones(len(curves)) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (len(curves),) or np.any(~np.isfinite(w)) or np.any(w <= 0):
        raise InputError(f"{source}: weights must be one positive number per run")
    return Sweep(curves=curves, grid=grid[keep], losses=losses[:, keep], finals=finals, weights=w, name=name,
                 merged=int(grid.size - keep.size))


def distinct_steps(grid: np.ndarray) -> np.ndarray:
    """Indices of the points of ``grid`` (ascending t̂) kept for a replay: each one at least one integer
    step (1/STEP_SCALE of training) past the point kept before it, the first and the last always kept (the
    last replaces the one before it when they share a step)."""
    steps = np.rint(grid * STEP_SCALE).astype(int)
    if steps.size < 2 or np.all(np.diff(steps) > 0):
        return np.arange(grid.size)
    keep = [0]
    for i in range(1, steps.size):
        if steps[i] > steps[keep[-1]]:
            keep.append(i)
    if keep[-1] != steps.size - 1:
        if len(keep) > 1:
            keep[-1] = steps.size - 1
        else:
            keep.append(steps.size - 1)
    return np.asarray(keep)


def _interp(grid: np.ndarray, t: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Linear interpolation of (t, y) on ``grid``; infinite from the first infinite point of ``y`` on."""
    bad = np.flatnonzero(~np.isfinite(y))
    if not bad.size:
        return np.interp(grid, t, y)
    cut = t[bad[0]]
    ok = np.isfinite(y)
    out = np.interp(grid, t[ok], y[ok]) if ok.any() else np.full(grid.shape, math.inf)
    out[grid >= cut] = math.inf
    return out


class ReplayPruner(Protocol):
    """What the replay harness drives. One object is used for one replay (one trial order)."""

    name: str

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        """Reset all state for a fresh replay of ``sweep``."""

    def start(self, trial: int) -> None:
        """Trial ``trial`` (an index into the sweep) starts on a worker."""

    def report(self, trial: int, index: int) -> bool:
        """The trial reports grid point ``index``; return True to stop (prune) it."""

    def finish(self, trial: int, pruned: bool) -> None:
        """The trial ended: pruned, or complete (its final loss is ``sweep.finals[trial]``)."""


@dataclass
class ReplayResult:
    """Outcome of one replay of one sweep in one trial order."""

    pruner: str
    order: list[int]
    stopped_at: np.ndarray  # index of the last grid point each trial reported
    pruned: np.ndarray  # bool per trial
    compute: float
    regret: float
    relative_regret: float
    best_pruned: bool
    decision_fractions: list[float] = field(default_factory=list)
    late_compute: float = 0.0  # tokens of trials pruned after t̂ LATE_FRACTION / tokens of the unpruned sweep


def simulate(sweep: Sweep, pruner: ReplayPruner, order: Sequence[int], *, workers: int = 4,
             seed: int = 0) -> ReplayResult:
    """Run one replay: trials start in ``order`` on ``workers`` concurrent workers, reporting every grid
    point.

    Each tick, every busy worker's trial reports its next grid point (workers in a fixed order); a trial stops
    when the pruner says so or when it reports the last point (complete). A stop at the last point counts as
    complete. Freed workers take the next trial in the order before the next tick.
    """
    if workers < 1:
        raise InputError(f"replay: workers must be at least 1, got {workers}")
    n, last = sweep.n_trials, sweep.grid.size - 1
    pruner.new_sweep(sweep, seed)
    queue = list(order)
    running: list[list[int]] = []  # [trial, next index]
    stopped_at = np.full(n, -1)
    pruned = np.zeros(n, dtype=bool)
    while queue or running:
        while queue and len(running) < workers:
            trial = queue.pop(0)
            pruner.start(trial)
            running.append([trial, 0])
        still: list[list[int]] = []
        for trial, idx in running:
            # A non-finite loss is a diverged run: stopped there, whatever the pruner (as a live sweep does).
            stop = not np.isfinite(sweep.losses[trial, idx]) or pruner.report(trial, idx)
            if idx >= last or stop:
                stopped_at[trial] = idx
                pruned[trial] = idx < last
                pruner.finish(trial, pruned=bool(pruned[trial]))
            else:
                still.append([trial, idx + 1])
        running = still
    reached = sweep.grid[stopped_at] / sweep.grid[-1]
    compute = float(np.sum(reached * sweep.weights) / np.sum(sweep.weights))
    late = pruned & (reached > LATE_FRACTION + 1e-9)
    late_compute = float(np.sum((reached * sweep.weights)[late]) / np.sum(sweep.weights))
    kept = ~pruned
    best_all = float(np.min(sweep.finals))
    best_kept = float(np.min(sweep.finals[kept])) if kept.any() else math.inf
    regret = best_kept - best_all
    return ReplayResult(
        pruner=pruner.name,
        order=list(order),
        stopped_at=stopped_at,
        pruned=pruned,
        compute=compute,
        regret=regret,
        relative_regret=regret / abs(best_all) if best_all != 0 else math.inf,
        best_pruned=bool(pruned[sweep.best]),
        decision_fractions=[float(sweep.grid[stopped_at[i]]) for i in np.flatnonzero(pruned)],
        late_compute=late_compute,
    )


def random_orders(n_trials: int, n_orders: int, seed: int = 0) -> list[list[int]]:
    """``n_orders`` random permutations of the trial indices (reproducible from ``seed``)."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n_trials).tolist() for _ in range(n_orders)]


@dataclass
class Summary:
    """One pruner's replays of one sweep, summarized over trial orders."""

    pruner: str
    sweep: str
    orders: int
    compute: float  # mean fraction of unpruned tokens
    regret: float  # mean regret (loss units)
    relative_regret: float  # mean regret / best final loss
    max_relative_regret: float
    best_pruned_rate: float  # fraction of orders in which the true best trial was pruned
    pruned_rate: float  # mean fraction of trials pruned
    decision_median: float  # median t̂ of the prune decisions (NaN when nothing was pruned)
    decision_p10: float
    decision_p90: float
    late_compute: float = 0.0  # mean share of the unpruned sweep's tokens spent on trials pruned after t̂ 0.3

    def row(self) -> dict[str, object]:
        """The summary as a flat dict for tables and CSV."""
        return dict(self.__dict__)


def summarize(sweep: Sweep, results: Sequence[ReplayResult]) -> Summary:
    """Average a pruner's replays over orders."""
    if not results:
        raise ValueError("summarize: no replay results")
    dec = [f for r in results for f in r.decision_fractions]
    rel = np.array([r.relative_regret for r in results])
    return Summary(
        pruner=results[0].pruner,
        sweep=sweep.name,
        orders=len(results),
        compute=float(np.mean([r.compute for r in results])),
        regret=float(np.mean([r.regret for r in results])),
        relative_regret=float(np.mean(rel)),
        max_relative_regret=float(np.max(rel)),
        best_pruned_rate=float(np.mean([r.best_pruned for r in results])),
        pruned_rate=float(np.mean([r.pruned.mean() for r in results])),
        decision_median=float(np.median(dec)) if dec else math.nan,
        decision_p10=float(np.percentile(dec, 10)) if dec else math.nan,
        decision_p90=float(np.percentile(dec, 90)) if dec else math.nan,
        late_compute=float(np.mean([r.late_compute for r in results])),
    )


@dataclass
class ReplayCaches:
    """What one pruner's replays share across trial orders: nothing that depends on the order.

    - ``predictions``: every ``predict_final_loss`` call (predictors/predict.py, ``PredictionCache``): the
      prediction of trial i from its first k reports against one surrogate is the same in every order.
    - ``fits``: the online reference's calibrations (hpo/rule/reference.py, ``FitCache``), keyed by exactly
    the
      curves fitted (their names, points and controls, in order).

    Both are exact: a hit returns what the call would have computed. Counts of hits and misses are kept.
    """

    predictions: Any = None
    fits: Any = None

    @classmethod
    def new(cls) -> ReplayCaches:
        """Empty caches."""
        return cls(predictions=PredictionCache(), fits=FitCache())

    @contextmanager
    def active(self) -> Iterator[ReplayCaches]:
        """Install both caches for the calls made in the block."""
        with caching(self.predictions), fit_caching(self.fits):
            yield self

    def stats(self) -> dict[str, int]:
        """Hits and misses of both caches."""
        p, f = self.predictions, self.fits
        return {"prediction_hits": p.hits, "prediction_misses": p.misses, "fit_hits": f.hits,
                "fit_misses": f.misses, "fit_set_repeats": f.set_repeats}


#: What the worker processes of ``replay(jobs > 1)`` inherit (fork): the sweep, the factories, the orders.
_POOL: dict[str, Any] = {}


def _run_order(task: tuple[int, int]) -> tuple[int, int, ReplayResult, dict[str, int] | None]:
    """One order of one pruner in a worker process (its caches live for the process's life); returns the
    result and what this order added to the cache counts."""
    i, k = task
    sweep, factories, perms = _POOL["sweep"], _POOL["factories"], _POOL["perms"]
    caches = _POOL["caches"].setdefault(i, ReplayCaches.new()) if _POOL["cache"] else None
    before = caches.stats() if caches is not None else None
    with caches.active() if caches is not None else nullcontext():
        result = simulate(sweep, factories[i](), perms[k], workers=_POOL["workers"], seed=_POOL["seed"] + k)
    if caches is None or before is None:
        return i, k, result, None
    return i, k, result, {key: v - before[key] for key, v in caches.stats().items()}


def replay(
    sweep: Sweep,
    pruners: Sequence[Callable[[], ReplayPruner]],
    *,
    orders: int = 20,
    workers: int = 4,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
    cache: bool = True,
    stats: dict[str, dict[str, int]] | None = None,
) -> tuple[list[Summary], dict[str, list[ReplayResult]]]:
    """Replay ``sweep`` through each pruner (a factory: a fresh object per order) over the same random
    orders.

    Args:
        jobs: processes to spread the (pruner, order) replays over (1: this process). The results are the
            same for any ``jobs``; with more than 1 the work runs in forked worker processes (POSIX).
        cache: share what does not depend on the order across one pruner's orders (``ReplayCaches``);
            the decisions are the same either way, only faster.
        progress: called with each pruner's summary row when its orders are done, and with a line on the
            orders done so far at most every ``PROGRESS_EVERY`` seconds of a long pruner.
        stats: when given, filled with each pruner's cache hits and misses (summed over processes).
    """
    if jobs < 1:
        raise InputError(f"replay: jobs must be at least 1, got {jobs}")
    if not pruners:
        raise InputError("replay: no pruners to replay; give at least one (hpo.replays.peers.factory)")
    perms = random_orders(sweep.n_trials, orders, seed)
    results: dict[int, dict[int, ReplayResult]] = {i: {} for i in range(len(pruners))}
    summaries: dict[int, Summary] = {}
    started: dict[int, float] = {}
    said: dict[int, float] = {}

    def done(i: int, k: int, result: ReplayResult) -> None:
        results[i][k] = result
        now = time.perf_counter()
        n = len(results[i])
        if n == orders:
            s = summarize(sweep, [results[i][j] for j in range(orders)])
            summaries[i] = s
            if progress is not None:
                progress(format_row(s))
        elif progress is not None and now - said.get(i, started[i]) >= PROGRESS_EVERY:
            said[i] = now
            progress(f"  {result.pruner}: {n}/{orders} orders done ({now - started[i]:.0f} s)")

    if jobs == 1 or len(pruners) * orders == 1:
        for i, make in enumerate(pruners):
            caches = ReplayCaches.new() if cache else None
            started[i] = time.perf_counter()
            for k, order in enumerate(perms):
                with caches.active() if caches is not None else nullcontext():
                    r = simulate(sweep, make(), order, workers=workers, seed=seed + k)
                done(i, k, r)
            if stats is not None and caches is not None:
                stats[summaries[i].pruner] = caches.stats()
    else:
        _pool_replay(sweep, pruners, perms, workers, seed, jobs, cache, started, done, stats)
    ordered = [summaries[i] for i in range(len(pruners))]
    details = {summaries[i].pruner: [results[i][k] for k in range(orders)] for i in range(len(pruners))}
    return ordered, details


#: Seconds between two progress lines of one long pruner.
PROGRESS_EVERY = 10.0


def _pool_replay(
    sweep: Sweep,
    pruners: Sequence[Callable[[], ReplayPruner]],
    perms: list[list[int]],
    workers: int,
    seed: int,
    jobs: int,
    cache: bool,
    started: dict[int, float],
    done: Callable[[int, int, ReplayResult], None],
    stats: dict[str, dict[str, int]] | None,
) -> None:
    """Run every (pruner, order) replay in ``jobs`` forked processes; ``done`` gets each result."""
    import multiprocessing

    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:
        raise InputError("replay: jobs > 1 needs the 'fork' start method (Linux, macOS); use 1 job") from None
    _POOL.update(sweep=sweep, factories=list(pruners), perms=perms, workers=workers, seed=seed, cache=cache,
                 caches={})
    tasks = [(i, k) for i in range(len(pruners)) for k in range(len(perms))]
    t0 = time.perf_counter()
    for i in range(len(pruners)):
        started[i] = t0
    try:
        with ctx.Pool(min(jobs, len(tasks))) as pool:
            for i, k, result, counts in pool.imap_unordered(_run_order, tasks):
                done(i, k, result)
                if stats is not None and counts is not None:
                    total = stats.setdefault(result.pruner, dict.fromkeys(counts, 0))
                    for key, value in counts.items():
                        total[key] += value
    finally:
        _POOL.clear()


TABLE_COLUMNS = (
    ("pruner", "{:<22}"), ("compute", "{:>8.3f}"), ("relative_regret", "{:>10.4%}"),
    ("max_relative_regret", "{:>10.4%}"), ("best_pruned_rate", "{:>8.2f}"), ("pruned_rate", "{:>7.2f}"),
    ("decision_median", "{:>7.3f}"), ("late_compute", "{:>8.3f}"),
)
TABLE_HEADER = ("pruner", "compute", "regret", "max regret", "best cut", "pruned", "t̂ dec", "late")


def format_row(s: Summary) -> str:
    """One aligned text row of the summary table."""
    row = s.row()
    cells = []
    for (key, fmt), head in zip(TABLE_COLUMNS, TABLE_HEADER):
        width = int("".join(ch for ch in fmt.split(":")[1].split(".")[0] if ch.isdigit()) or len(head))
        value = row[key]
        cells.append(fmt.format(value) if not (isinstance(value, float) and math.isnan(value))
                     else "-".rjust(width))
    return " ".join(cells)


def format_table(summaries: Sequence[Summary]) -> str:
    """An aligned text table: compute (fraction of unpruned tokens), regret (of best final loss), late (the
    share of the unpruned tokens spent on trials pruned after t̂ ``LATE_FRACTION``)."""
    return "\n".join([format_header(), *(format_row(s) for s in summaries)])


def format_header() -> str:
    """The header line of ``format_table``, aligned with ``format_row``'s columns."""
    widths = [22, 8, 10, 10, 8, 7, 7, 8]
    pairs = enumerate(zip(TABLE_HEADER, widths))
    return " ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in pairs)


def markdown_table(summaries: Sequence[Summary]) -> str:
    """The summaries as a Markdown table (for RESULTS files)."""
    lines = [
        "| sweep | pruner | compute | mean regret | max regret | best pruned | pruned "
        f"| median t̂ of decisions | compute pruned after t̂ {LATE_FRACTION:g} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        dec = "-" if math.isnan(s.decision_median) else f"{s.decision_median:.3f}"
        lines.append(
            f"| {s.sweep} | {s.pruner} | {s.compute:.3f} | {s.relative_regret:.3%} "
            f"| {s.max_relative_regret:.3%} "
            f"| {s.best_pruned_rate:.2f} | {s.pruned_rate:.2f} | {dec} | {s.late_compute:.3f} |"
        )
    return "\n".join(lines)


def write_summary_csv(path: str | os.PathLike[str], summaries: Sequence[Summary]) -> None:
    """Write the summaries as CSV, atomically (temp file + os.replace)."""

    path = Path(path)
    keys = list(summaries[0].row()) if summaries else [f.name for f in Summary.__dataclass_fields__.values()]

    spreadsheet.write_csv(path, keys, (s.row() for s in summaries))


#: The targets a τ-held sweep's pruner is held to (issue 10): at most this fraction of the unpruned sweep's
#: tokens, at a mean regret of at most this fraction of the best final loss. Drawn as guides on the plot.
TARGET_COMPUTE = 0.30
TARGET_REGRET = 0.001


def plot_compute_regret(path: str | os.PathLike[str], summaries: Sequence[Summary], title: str = "") -> None:
    """Scatter of mean compute (fraction of unpruned tokens) against mean relative regret, one point per
    pruner, with the targets (`TARGET_COMPUTE`, `TARGET_REGRET`) as dashed guides.

    Written atomically as PNG. Regret is drawn on a symlog axis so that zero regret stays visible.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    sweeps = sorted({s.sweep for s in summaries})
    markers = "osD^v<>ph*"
    for j, sw in enumerate(sweeps):
        for s in (s for s in summaries if s.sweep == sw):
            color = "tab:red" if s.pruner.startswith("collapse") else None
            ax.scatter(s.compute, 100 * s.relative_regret, marker=markers[j % len(markers)], color=color,
                       s=40)
            ax.annotate(s.pruner, (s.compute, 100 * s.relative_regret), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_yscale("symlog", linthresh=0.05)
    ax.axhline(100 * TARGET_REGRET, color="grey", lw=0.8, ls="--",
               label=f"target regret {100 * TARGET_REGRET:g}%")
    ax.axvline(TARGET_COMPUTE, color="grey", lw=0.8, ls=":", label=f"target compute {TARGET_COMPUTE:g}")
    ax.set_xlabel("compute (fraction of unpruned sweep tokens)")
    ax.set_ylabel("regret (% of best final loss)")
    ax.set_title(title or ", ".join(sweeps))
    if len(sweeps) > 1:
        for j, sw in enumerate(sweeps):
            ax.scatter([], [], marker=markers[j % len(markers)], color="k", label=sw)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN with fewer than 3 finite pairs."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 3:
        return math.nan

    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="mergesort")
        r = np.empty(v.size)
        r[order] = np.arange(v.size, dtype=float)
        for val in np.unique(v):
            m = v == val
            if m.sum() > 1:
                r[m] = r[m].mean()
        return r

    ra, rb = ranks(a) - (a.size - 1) / 2, ranks(b) - (b.size - 1) / 2
    den = math.sqrt(float(np.sum(ra**2) * np.sum(rb**2)))
    return float(np.sum(ra * rb) / den) if den > 0 else math.nan
