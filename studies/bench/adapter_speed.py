"""Benchmark (not a test): what the two adapters cost per result, as a sweep's curves grow (issue 13, item 1).

Two workloads, both with ``--trials`` trials (default 64) of ``--reports`` reports each (default 1,000, at
t̂ = i / reports; tokens = t̂ · 1,000,000), run ``--concurrent`` at a time (default 8) with their reports
interleaved round-robin, as a Tune controller or several Optuna workers would deliver them:

- **scheduler**: the real ``CollapseScheduler`` (hpo/ray_side/scheduler.py) driven through ``on_trial_add`` /
  ``on_trial_result`` / ``on_trial_complete`` as Tune's controller calls them (stub ``ray.tune`` Trial
  objects, no cluster), with its state file on disk in ``--dir`` (time_attr ``tokens``, total_tokens
  1,000,000).
- **pruner**: the real ``CollapsePruner`` (hpo/optuna_side/pruner.py) on an Optuna study in a SQLite file in
``--dir``
  (``study.ask``, real ``trial.report(loss, step=tokens)`` and ``trial.should_prune()``, ``study.tell``).

scipy.stats is imported before the clock starts (the first prediction of a process imports it, once,
in seconds). The curves are the test surrogate's collapsed shape times each trial's final loss
(3.0 · (1 + 0.03 u), u uniform, seed 0) with 0.2% multiplicative noise, so most trials are kept to the
end (the finals are within the 4% margin) and the curves reach their full length. Defaults of both
adapters (judge_every 0.02, min_fraction 0.1, paired comparison).

Printed (and written as a markdown table to ``--out``):

Wall-clock figures, and the CPU time of this process for the same calls (``time.process_time``: fairer on a
machine that other jobs load, but blind to waits on the disk).

- scheduler: mean and p50/p99/max ms per ``on_trial_result``; the same split into results that were a
  judgement (a decision entry was logged) and the others; the judge's own time at judgements; the state
  files' size at the end and the bytes written per result (from /proc/self/io when readable).
- pruner: ``trial.report`` (Optuna's storage write) ms; ``should_prune`` ms between judgements and at
  judgements, each with the part spent in storage calls (every method of the study's storage object is
  timed) and the rest (the pruner's own work); the judge's own time at judgements.

Targets (issue 13): scheduler ≤ 1 ms per result on average; ``should_prune`` ≤ 2 ms at the p99 between
judgements; a judgement ≤ 5 ms. The first and last 10% of each trial's reports are also reported separately
(``early``/``late``), which shows whether the per-result cost grows with the curve.

Run:  .venv/bin/python studies/bench/adapter_speed.py          (a few minutes on 2 cores)
      .venv/bin/python studies/bench/adapter_speed.py --trials 16 --reports 250 --only scheduler
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TOTAL = 1_000_000
TAU, TPP = 0.1, 20.0
NOISE = 0.002


def surrogate() -> Any:
    """The test suite's surrogate (tests/test_scheduler_unit.py), with a 1% single-run error band."""
    from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

    return Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                     error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])


def curves(trials: int, reports: int) -> tuple[np.ndarray, np.ndarray]:
    """(t̂ grid [reports], losses [trials, reports]) of the synthetic sweep."""
    from collapse_hpo.predictors.schedules import Schedule

    rng = np.random.default_rng(0)
    t = np.arange(1, reports + 1) / reports
    shape = np.asarray(surrogate().normalized(t, Schedule(), TAU, TPP), dtype=float)
    finals = 3.0 * (1.0 + 0.03 * rng.uniform(size=trials))
    noise = 1.0 + NOISE * rng.standard_normal(size=(trials, reports))
    return t, finals[:, None] * shape[None, :] * noise


def schedule_reports(trials: int, concurrent: int, alive: Callable[[int], bool]) -> Iterator[int]:
    """Trial indices in delivery order: ``concurrent`` trials at a time, round-robin, a new one starting as
    one ends (``alive(trial)`` is False once it ended)."""
    waiting = list(range(trials))
    running: list[int] = []
    while waiting or running:
        while waiting and len(running) < concurrent:
            running.append(waiting.pop(0))
        for trial in list(running):
            if alive(trial):
                yield trial
            if not alive(trial):
                running.remove(trial)


@dataclass
class Timer:
    """Accumulated seconds of timed calls (nested calls of the same timer are counted once)."""

    seconds: float = 0.0
    calls: int = 0
    depth: int = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
                self.depth -= 1

        return timed


@dataclass
class Series:
    """Samples in milliseconds."""

    ms: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.ms.append(seconds * 1e3)

    def stats(self) -> dict[str, float]:
        if not self.ms:
            return {"n": 0, "mean": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}
        a = np.asarray(self.ms)
        return {"n": a.size, "mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
                "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def _judge_spy(judge: Any) -> tuple[Timer, list[bool]]:
    """Time the judge's ``judge`` calls and note whether the last one logged an entry (a judgement)."""
    timer, last = Timer(), [False]
    inner = timer.wrap(judge.judge)

    def spy(*args: Any, **kwargs: Any) -> Any:
        verdict = inner(*args, **kwargs)
        last[0] = verdict.entry is not None
        return verdict

    judge.judge = spy
    return timer, last


def _io_written() -> int | None:
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------- scheduler
def bench_scheduler(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler

    t_grid, losses = curves(args.trials, args.reports)
    folder = work / "scheduler"
    folder.mkdir()
    s = CollapseScheduler(reference=surrogate(), time_attr="tokens", total_tokens=TOTAL, tau=TAU, tpp=TPP,
                          state_path=folder / "collapse_scheduler_state.json")
    assert s.set_search_properties(None, None)
    judge_timer, judged = _judge_spy(s.judge)
    stubs = {i: Trial("bench", trial_id=f"{i:05d}", stub=True) for i in range(args.trials)}
    nxt = dict.fromkeys(range(args.trials), 0)
    ended: set[int] = set()
    pruned = 0
    every, judgements, between, early, late = Series(), Series(), Series(), Series(), Series()
    judge_ms = Series()
    cpu_every, cpu_between, cpu_judgements = Series(), Series(), Series()
    io0 = _io_written()
    start = time.perf_counter()
    for trial in schedule_reports(args.trials, args.concurrent, lambda i: i not in ended):
        stub, i = stubs[trial], nxt[trial]
        if i == 0:
            s.on_trial_add(None, stub)
        result = {"loss": float(losses[trial, i]), "tokens": round(float(t_grid[i]) * TOTAL),
                  "training_iteration": i + 1}
        judged[0] = False
        before = judge_timer.seconds
        c0, t0 = time.process_time(), time.perf_counter()
        action = s.on_trial_result(None, stub, result)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        every.add(dt)
        cpu_every.add(cpu)
        (judgements if judged[0] else between).add(dt)
        (cpu_judgements if judged[0] else cpu_between).add(cpu)
        if judged[0]:
            judge_ms.add(judge_timer.seconds - before)
        if i < args.reports // 10:
            early.add(dt)
        elif i >= args.reports - args.reports // 10:
            late.add(dt)
        nxt[trial] = i + 1
        if action == TrialScheduler.STOP:
            pruned += 1
            ended.add(trial)
        elif i + 1 == args.reports:
            s.on_trial_complete(None, stub, result)
            ended.add(trial)
    wall = time.perf_counter() - start
    io1 = _io_written()
    written = None if io0 is None or io1 is None else io1 - io0
    return {
        "results": len(every.ms), "pruned": pruned, "wall_s": wall, "every": every.stats(),
        "judgement": judgements.stats(), "between": between.stats(), "judge": judge_ms.stats(),
        "cpu_every": cpu_every.stats(), "cpu_between": cpu_between.stats(),
        "cpu_judgement": cpu_judgements.stats(),
        "early": early.stats(), "late": late.stats(), "state_bytes": _dir_bytes(folder),
        "written_per_result": None if written is None else written / max(1, len(every.ms)),
    }


# ------------------------------------------------------------------------------------------- pruner
def bench_pruner(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import optuna

    from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t_grid, losses = curves(args.trials, args.reports)
    url = f"sqlite:///{work / 'bench.db'}"
    pruner = CollapsePruner(reference=surrogate(), total_tokens=TOTAL, tau=TAU, tpp=TPP)
    study = optuna.create_study(storage=url, study_name="bench", direction="minimize", pruner=pruner,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    judge_timer, judged = _judge_spy(pruner._judge)
    storage_timer = Timer()
    storage = study._storage  # the object every study/trial call goes through (private: a benchmark)
    for name in dir(storage):
        attr = getattr(storage, name)
        if not name.startswith("__") and callable(attr) and not isinstance(attr, type):
            setattr(storage, name, storage_timer.wrap(attr))
    live: dict[int, Any] = {}
    nxt = dict.fromkeys(range(args.trials), 0)
    ended: set[int] = set()
    pruned = 0
    report = Series()
    between, between_storage, between_own = Series(), Series(), Series()
    judgement, judgement_storage, judgement_own, judge_ms = Series(), Series(), Series(), Series()
    early, late = Series(), Series()
    cpu_between, cpu_judgement = Series(), Series()
    start = time.perf_counter()
    for trial in schedule_reports(args.trials, args.concurrent, lambda i: i not in ended):
        i = nxt[trial]
        if i == 0:
            live[trial] = study.ask()
            live[trial].suggest_float("x", 0.0, 1.0)
        t = live[trial]
        t0 = time.perf_counter()
        t.report(float(losses[trial, i]), step=round(float(t_grid[i]) * TOTAL))
        report.add(time.perf_counter() - t0)
        judged[0] = False
        s0, j0 = storage_timer.seconds, judge_timer.seconds
        c0, t0 = time.process_time(), time.perf_counter()
        prune = t.should_prune()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        (cpu_judgement if judged[0] else cpu_between).add(cpu)
        in_storage = storage_timer.seconds - s0
        if judged[0]:
            judgement.add(dt)
            judgement_storage.add(in_storage)
            judgement_own.add(dt - in_storage)
            judge_ms.add(judge_timer.seconds - j0)
        else:
            between.add(dt)
            between_storage.add(in_storage)
            between_own.add(dt - in_storage)
            if i < args.reports // 10:
                early.add(dt)
            elif i >= args.reports - args.reports // 10:
                late.add(dt)
        nxt[trial] = i + 1
        if prune:
            pruned += 1
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            ended.add(trial)
        elif i + 1 == args.reports:
            study.tell(t, float(losses[trial, i]))
            ended.add(trial)
    wall = time.perf_counter() - start
    return {
        "results": len(report.ms), "pruned": pruned, "wall_s": wall, "report": report.stats(),
        "between": between.stats(), "between_storage": between_storage.stats(),
        "between_own": between_own.stats(), "judgement": judgement.stats(),
        "judgement_storage": judgement_storage.stats(), "judgement_own": judgement_own.stats(),
        "judge": judge_ms.stats(),
        "early": early.stats(), "late": late.stats(), "cpu_between": cpu_between.stats(),
        "cpu_judgement": cpu_judgement.stats(),
    }


# ------------------------------------------------------------------------------------------- output
def _row(name: str, st: dict[str, float]) -> str:
    return (f"| {name} | {st['n']} | {st['mean']:.3f} | {st['p50']:.3f} | {st['p99']:.3f} | "
            f"{st['max']:.2f} |")


def _verdict(value: float, target: float) -> str:
    return "met" if value <= target else "**missed**"


def table(args: argparse.Namespace, sched: dict[str, Any] | None, prun: dict[str, Any] | None) -> str:
    head = "| what | n | mean ms | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|"
    out = [
        "# Adapter speed (issue 13, item 1)",
        "",
        f"`{' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}`: {args.trials} trials × "
        f"{args.reports} reports, {args.concurrent} at a time; written "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.",
        "",
    ]
    if sched is not None:
        w = sched["written_per_result"]
        out += [
            "## CollapseScheduler (state file on disk)",
            "",
            f"{sched['results']} results, {sched['pruned']} trials pruned, {sched['wall_s']:.1f} s; state "
            f"files {sched['state_bytes'] / 1e6:.2f} MB at the end"
            + ("" if w is None else f"; {w:,.0f} bytes written per result (wchar)") + ".",
            "",
            head,
            _row("on_trial_result, every result", sched["every"]),
            _row("on_trial_result, between judgements", sched["between"]),
            _row("on_trial_result, judgements", sched["judgement"]),
            _row("judge only, at judgements", sched["judge"]),
            _row("on_trial_result, every result: CPU time", sched["cpu_every"]),
            _row("on_trial_result, between judgements: CPU time", sched["cpu_between"]),
            _row("on_trial_result, judgements: CPU time", sched["cpu_judgement"]),
            _row("on_trial_result, first 10% of each curve", sched["early"]),
            _row("on_trial_result, last 10% of each curve", sched["late"]),
            "",
            f"Targets: mean per result ≤ 1 ms: {sched['every']['mean']:.3f} ms, "
            f"{_verdict(sched['every']['mean'], 1.0)}; judgement ≤ 5 ms: mean "
            f"{sched['judgement']['mean']:.2f} ms / p99 {sched['judgement']['p99']:.2f} ms, "
            f"{_verdict(sched['judgement']['p99'], 5.0)} (p99).",
            "",
        ]
    if prun is not None:
        out += [
            "## CollapsePruner (Optuna study on SQLite)",
            "",
            f"{prun['results']} reports, {prun['pruned']} trials pruned, {prun['wall_s']:.1f} s.",
            "",
            head,
            _row("trial.report (storage write)", prun["report"]),
            _row("should_prune, between judgements", prun["between"]),
            _row("  of which storage calls", prun["between_storage"]),
            _row("  of which the pruner's own work", prun["between_own"]),
            _row("should_prune, judgements", prun["judgement"]),
            _row("  of which storage calls", prun["judgement_storage"]),
            _row("  of which the pruner's own work (judge included)", prun["judgement_own"]),
            _row("judge call, at judgements (its study reads included)", prun["judge"]),
            _row("should_prune, between judgements: CPU time", prun["cpu_between"]),
            _row("should_prune, judgements: CPU time", prun["cpu_judgement"]),
            _row("should_prune between judgements, first 10% of each curve", prun["early"]),
            _row("should_prune between judgements, last 10% of each curve", prun["late"]),
            "",
            f"Targets: should_prune p99 between judgements ≤ 2 ms: {prun['between']['p99']:.3f} ms, "
            f"{_verdict(prun['between']['p99'], 2.0)}; judgement ≤ 5 ms: mean "
            f"{prun['judgement']['mean']:.2f} ms / p99 {prun['judgement']['p99']:.2f} ms (should_prune, "
            "storage included), "
            f"{_verdict(prun['judgement']['p99'], 5.0)} (p99); without the storage calls: mean "
            f"{prun['judgement_own']['mean']:.2f} / p99 {prun['judgement_own']['p99']:.2f} ms, "
            f"{_verdict(prun['judgement_own']['p99'], 5.0)} (p99).",
            "",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64, help="trials per workload (default 64)")
    parser.add_argument("--reports", type=int, default=1000, help="reports per trial (default 1000)")
    parser.add_argument("--concurrent", type=int, default=8, help="trials running at once (default 8)")
    parser.add_argument("--only", choices=("scheduler", "pruner"), help="run one workload")
    parser.add_argument("--dir", type=Path, help="where the state files and the SQLite file go (default: a "
                        "temporary folder on disk, removed afterwards)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "artifacts" / "adapter_speed.md",
                        help="markdown table (default studies/bench/artifacts/adapter_speed.md)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.reports < 10 or args.concurrent < 1:
        parser.error("--trials and --concurrent must be ≥ 1 and --reports ≥ 10")
    import warnings

    warnings.simplefilter("ignore")  # the Optuna experimental-API notes would flood the output
    import scipy.stats  # noqa: F401  - warm-up: the first prediction imports it (seconds, once per process)

    work = Path(tempfile.mkdtemp(prefix="adapter-speed-", dir=args.dir))
    try:
        sched = None if args.only == "pruner" else bench_scheduler(args, work)
        prun = None if args.only == "scheduler" else bench_pruner(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = table(args, sched, prun)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(f"\nwritten: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
